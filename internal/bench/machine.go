package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
)

// machineInfo says where the numbers came from.
type machineInfo struct {
	CPU      string `json:"cpu"`
	CPUs     int    `json:"cpus"`
	MemGiB   int64  `json:"memGiB"`
	Kernel   string `json:"kernel"`
	QEMU     string `json:"qemu"`
	Accel    string `json:"accel"`
	Hostname string `json:"hostname"`
}

func probeMachine(ctx context.Context) (machineInfo, error) {
	cfg, err := config.Load("")
	if err != nil {
		return machineInfo{}, err
	}
	drv := qemu.New(cfg.QEMU)
	build, err := drv.Build(ctx)
	if err != nil {
		return machineInfo{}, err
	}
	accel, _, err := drv.Accel()
	if err != nil {
		return machineInfo{}, err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return machineInfo{}, fmt.Errorf("uname: %w", err)
	}
	host, _ := os.Hostname()
	m := machineInfo{
		CPU: cpuinfo("model name"), CPUs: runtime.NumCPU(), MemGiB: memTotalGiB(),
		Kernel: unix.ByteSliceToString(uts.Release[:]), QEMU: build, Accel: accel, Hostname: host,
	}
	return m, nil
}

// loadAvg is the 1-minute load average, 0 if unreadable: how much else the
// machine was running, which moves every number.
func loadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func cpuinfo(key string) string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func memTotalGiB() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit) >> 30
}
