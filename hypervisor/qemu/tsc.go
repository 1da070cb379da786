package qemu

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Under TCG the guest reads the host's TSC, but a microvm guest has no
// HPET or ACPI PM timer to calibrate it against, and PIT calibration fails
// when the host is busy (the emulated port reads are too slow). The kernel
// then marks the TSC unusable and hangs before userspace. Telling it the
// frequency (tsc_early_khz) skips the calibration.
const tscParam = "tsc_early_khz="

// tcgCmdline returns cmdline with the host TSC frequency added, unless the
// cmdline sets it already.
func tcgCmdline(cmdline string) string {
	if strings.Contains(cmdline, tscParam) {
		return cmdline
	}
	khz := hostTSCkHz()
	if khz == 0 {
		return cmdline
	}
	return strings.TrimSpace(fmt.Sprintf("%s %s%d", cmdline, tscParam, khz))
}

// hostTSCkHz measures the TSC against the wall clock: the median of three
// 20 ms samples, so a preempted sample does not count.
func hostTSCkHz() int64 {
	var samples []int64
	for range 3 {
		t0, c0 := time.Now(), rdtsc()
		time.Sleep(20 * time.Millisecond)
		c1, t1 := rdtsc(), time.Now()
		samples = append(samples, int64(float64(c1-c0)/float64(t1.Sub(t0).Microseconds())*1000))
	}
	slices.Sort(samples)
	return samples[1]
}
