package qemu

// rdtsc reads the time-stamp counter (tsc_amd64.s).
func rdtsc() uint64
