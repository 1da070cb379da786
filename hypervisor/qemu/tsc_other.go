//go:build !amd64

package qemu

// rdtsc is unavailable off x86: no TSC hint is added.
func rdtsc() uint64 { return 0 }
