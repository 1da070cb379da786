package restore

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// ThisHost is the machine the process runs on: its RAM and CPUs.
func ThisHost() Host {
	h := Host{CPUs: runtime.NumCPU()}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		h.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	return h
}
