// Package cpuload measures how busy the machine's CPUs are, for benches
// that wait for a quiet machine before they time anything.
package cpuload

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// Busy is the share of the machine's CPU time, over d, not idle.
func Busy(d time.Duration) float64 {
	busy0, total0 := times()
	time.Sleep(d)
	busy1, total1 := times()
	if total1 <= total0 {
		return 1
	}
	return float64(busy1-busy0) / float64(total1-total0)
}

// times is the machine's busy and total CPU time in ticks, from the
// first line of /proc/stat (idle and iowait count as not busy).
func times() (busy, total uint64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, total
}
