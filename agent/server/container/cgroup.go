package container

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/cgroups/v3"
)

// cgroupRoot is where the cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// oomKills reads how many times the OOM killer killed a process of the
// cgroup at path (relative to the hierarchy's root): memory.events on
// cgroup v2, memory.oom_control on v1 (the host's, in tests).
func oomKills(path string) (uint64, error) {
	file := filepath.Join(cgroupRoot, path, "memory.events")
	if cgroups.Mode() != cgroups.Unified {
		file = filepath.Join(cgroupRoot, "memory", path, "memory.oom_control")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read oom kills: %w", err)
	}
	return keyedValue(data, "oom_kill")
}

// keyedValue reads the value of key from a cgroup file of "key value" lines.
func keyedValue(data []byte, key string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if ok && string(k) == key {
			n, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read %s: %w", key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s in the cgroup's file", key)
}
