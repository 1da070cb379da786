package state

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// StartTime returns when pid started, in clock ticks since boot (field 22
// of /proc/PID/stat). Together with the pid it names a process uniquely.
func StartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read process %d: %w", pid, err)
	}
	return parseStartTime(string(data))
}

func parseStartTime(stat string) (uint64, error) {
	// comm (field 2) is in parentheses and may itself contain spaces and
	// parentheses, so split after the last ')'.
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("parse /proc stat: no command field")
	}
	fields := strings.Fields(stat[end+1:])
	const startTimeField = 22 - 3 // fields after comm begin at field 3
	if len(fields) <= startTimeField {
		return 0, fmt.Errorf("parse /proc stat: %d fields after command, want > %d", len(fields), startTimeField)
	}
	v, err := strconv.ParseUint(fields[startTimeField], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc stat start time: %w", err)
	}
	return v, nil
}

// Running reports whether the hypervisor process t recorded still runs:
// the pid exists and started when it did when the record was written.
func (t *Task) Running() bool {
	if t.PID <= 0 {
		return false
	}
	start, err := StartTime(t.PID)
	return err == nil && start == t.PIDStart
}
