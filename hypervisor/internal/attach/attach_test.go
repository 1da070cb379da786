package attach

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
)

func TestCheckTap(t *testing.T) {
	n := drivertest.NewNet(t)
	n.AddTuntap(t, &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tun0"}, Mode: netlink.TUNTAP_MODE_TUN, Flags: netlink.TUNTAP_NO_PI, Queues: 1})
	n.AddTuntap(t, &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "fleeting0"}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI,
		NonPersist: true, Queues: 1})
	n.AddTuntap(t, &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "mq0"}, Mode: netlink.TUNTAP_MODE_TAP,
		Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_MULTI_QUEUE_DEFAULTS, Queues: 2})
	tests := []struct {
		name string
		nic  *hypervisor.NIC
		want string
	}{
		{"the restore's tap and queue", n.NIC, ""},
		{"a tap nobody holds", &hypervisor.NIC{TapName: n.NIC.TapName}, ""},
		{"tun", &hypervisor.NIC{TapName: "tun0"}, `nic "tun0" is a tun device`},
		{"not persistent", &hypervisor.NIC{TapName: "fleeting0"}, "is not persistent"},
		{"multi-queue", &hypervisor.NIC{TapName: "mq0"}, "is multi-queue"},
		{"missing", &hypervisor.NIC{TapName: "none0"}, `"none0" does not exist in network namespace`},
		{"template name", &hypervisor.NIC{TapName: "tap%d"}, "nic tap name"},
		{"name too long", &hypervisor.NIC{TapName: strings.Repeat("t", 16)}, "nic tap name"},
		{"queue of another file", &hypervisor.NIC{TapName: n.NIC.TapName, TapFile: n.NS}, "TUNGETIFF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckTap(n.NS, tt.nic)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("CheckTap = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestReleaseQueue(t *testing.T) {
	n := drivertest.NewNet(t)
	for range 2 {
		if err := ReleaseQueue(n.NIC); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.NIC.TapFile.Stat(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("the restore's queue after release: %v, want closed", err)
	}
	if tap := n.Tap(t); tap.Name != n.NIC.TapName {
		t.Errorf("tap after release: %+v", tap)
	}
	if err := ReleaseQueue(&hypervisor.NIC{TapName: "t"}); err != nil {
		t.Errorf("release without a queue: %v", err)
	}
}

func TestCheckDisk(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(image, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	tests := []struct{ path, want, wantErr string }{
		{image, image, ""},
		{"rootfs.img", image, ""},
		{dir, "", "is not a regular file"},
		{fifo, "", "is not a regular file"},
		{filepath.Join(dir, "none"), "", "no such file"},
	}
	for _, tt := range tests {
		got, err := CheckDisk(tt.path)
		if got != tt.want || tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CheckDisk(%s) = %q, %v; want %q, an error containing %q", tt.path, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestCheckNetNS(t *testing.T) {
	for _, tt := range []struct{ path, want string }{
		{"/proc/self/ns/net", ""},
		{"/proc/self/ns/uts", "a namespace of another type"},
		{"/proc/self/status", "want an nsfs file"},
	} {
		f, err := os.Open(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckNetNS(f)
		f.Close()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckNetNS(%s) = %v, want an error containing %q", tt.path, err, tt.want)
		}
	}
}

// BenchmarkCheck measures what a restore with a network namespace, a NIC
// and a disk spends checking them before the VMM starts.
func BenchmarkCheck(b *testing.B) {
	n := drivertest.NewNet(b)
	image := filepath.Join(b.TempDir(), "rootfs.img")
	if err := os.WriteFile(image, nil, 0o444); err != nil {
		b.Fatal(err)
	}
	req := hypervisor.RestoreRequest{NetNS: n.NS, NIC: n.NIC, Disk: image}
	for b.Loop() {
		if _, err := Check(req); err != nil {
			b.Fatal(err)
		}
	}
}
