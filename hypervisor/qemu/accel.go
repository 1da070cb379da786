package qemu

import (
	"fmt"
	"os"
)

// Accelerators this driver knows.
const (
	accelKVM = "kvm"
	accelTCG = "tcg"
)

// host is what the accelerator probe looks at; tests replace the paths.
type host struct {
	kvmDev string // /dev/kvm
	pvmMod string // /sys/module/kvm_pvm
}

var realHost = host{kvmDev: "/dev/kvm", pvmMod: "/sys/module/kvm_pvm"}

// probe picks kvm when /dev/kvm opens read-write and is not PVM (PVM only
// runs PVM-enlightened kernels: a stock guest crawls in KVM's emulator),
// tcg otherwise. The reason is for logs.
func (h host) probe() (accel, reason string) {
	if _, err := os.Stat(h.pvmMod); err == nil {
		return accelTCG, "kvm is PVM (" + h.pvmMod + " present): it cannot run a stock guest kernel"
	}
	f, err := os.OpenFile(h.kvmDev, os.O_RDWR, 0)
	if err != nil {
		return accelTCG, fmt.Sprintf("%s unusable: %v", h.kvmDev, err)
	}
	f.Close()
	return accelKVM, h.kvmDev + " usable"
}

// chooseAccel applies the config's accel ("auto", "kvm", "tcg" or empty for
// auto) over the probe.
func chooseAccel(configured string, h host) (accel, reason string, err error) {
	switch configured {
	case "", "auto":
		accel, reason = h.probe()
		return accel, reason, nil
	case accelKVM, accelTCG:
		return configured, "forced by config", nil
	}
	return "", "", fmt.Errorf("qemu accel %q: want auto, kvm or tcg", configured)
}

// cpuModel is the -cpu for accel unless config sets one. Under KVM,
// host minus arch-capabilities: plain host aborted on some hosts
// ("failed to set MSR 0x10a").
func cpuModel(configured, accel string) string {
	if configured != "" {
		return configured
	}
	if accel == accelKVM {
		return "host,-arch-capabilities"
	}
	return "max"
}

// hostMachine is the accelerator and CPU model this host runs: the
// config's, else the probe's.
func (d *Driver) hostMachine() (accel, cpu, reason string, err error) {
	accel, reason, err = d.Accel()
	if err != nil {
		return "", "", "", err
	}
	return accel, cpuModel(d.cfg.CPU, accel), reason, nil
}

// checkBakedOn refuses a snapshot baked with another accelerator or CPU
// model than this host runs: its CPU state would not load, or would load
// into a CPU the guest never saw. The image's strings are only compared,
// never passed to QEMU.
func checkBakedOn(s Shape, accel, cpu, reason string) error {
	if s.Accel == accel && s.CPU == cpu {
		return nil
	}
	return fmt.Errorf("snapshot baked with accel %q and cpu %q, but this host runs accel %q (%s) and cpu %q: "+
		"restore it on a host like the one that baked it, set [qemu] accel and cpu to match, or re-bake it here",
		s.Accel, s.CPU, accel, reason, cpu)
}
