package drivertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// BadAttachments describes a driver to RefusesBadAttachments.
type BadAttachments struct {
	// Driver returns a driver over a fake VMM, and the fake's record.
	Driver func(t testing.TB) (hypervisor.Driver, string)
	// Stage stages a chain whose snapshot has a network device and a
	// rootfs slot.
	Stage func(t testing.TB) string
}

// RefusesBadAttachments restores with a network namespace, NIC or disk a
// VMM cannot use, and expects each refused with an error naming it before
// any VMM starts: no run dir left, no process started, and the caller's
// tap and queue as they were.
func RefusesBadAttachments(t *testing.T, c BadAttachments) {
	n, other := NewNet(t), NewNet(t)
	notNS, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { notNS.Close() })
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  func(r *hypervisor.RestoreRequest)
		want string
	}{
		{"tap missing", func(r *hypervisor.RestoreRequest) {
			r.NetNS, r.NIC = n.NS, &hypervisor.NIC{TapName: "cvtmissing"}
		}, `nic tap "cvtmissing" does not exist in network namespace`},
		{"tap in another namespace", func(r *hypervisor.RestoreRequest) { r.NIC = n.NIC }, "does not exist in the caller's network namespace"},
		{"not a tap", func(r *hypervisor.RestoreRequest) { r.NetNS, r.NIC = n.NS, &hypervisor.NIC{TapName: "lo"} }, `nic "lo" in network namespace`},
		{"tap file of another tap", func(r *hypervisor.RestoreRequest) {
			r.NetNS, r.NIC = n.NS, &hypervisor.NIC{TapName: n.NIC.TapName, TapFile: other.NIC.TapFile}
		}, fmt.Sprintf("is a queue of %q, not of tap %q", other.NIC.TapName, n.NIC.TapName)},
		{"tap name a template", func(r *hypervisor.RestoreRequest) { r.NetNS, r.NIC = n.NS, &hypervisor.NIC{TapName: "tap%d"} }, `nic tap name "tap%d"`},
		{"namespace not a namespace", func(r *hypervisor.RestoreRequest) { r.NetNS = notNS }, "want an nsfs file"},
		{"disk a directory", func(r *hypervisor.RestoreRequest) { r.Disk = t.TempDir() }, "is not a regular file"},
		{"disk a FIFO", func(r *hypervisor.RestoreRequest) { r.Disk = fifo }, "is not a regular file"},
		{"disk missing", func(r *hypervisor.RestoreRequest) { r.Disk = filepath.Join(t.TempDir(), "none") }, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, record := c.Driver(t)
			req := hypervisor.RestoreRequest{StagedDir: c.Stage(t), RunDir: RunDir(t), Mode: hypervisor.ModeCopy}
			tt.req(&req)
			v, err := d.Restore(context.Background(), req)
			if err == nil {
				v.Close()
				t.Fatal("restore succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
			if _, err := os.Stat(req.RunDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("run dir left behind: %v", err)
			}
			if pids := apifake.PIDs(t, record); len(pids) != 0 {
				t.Errorf("fake pids %v, want none started", pids)
			}
			n.checkHeld(t)
		})
	}
}

// checkHeld fails t unless n's tap is there and the caller's queue of it
// open.
func (n *Net) checkHeld(t *testing.T) {
	t.Helper()
	if tap := n.Tap(t); tap.Mode != netlink.TUNTAP_MODE_TAP {
		t.Errorf("tap %s after a refused restore: %+v", n.NIC.TapName, tap)
	}
	if taps := TapsOf(t, os.Getpid()); !slices.Contains(taps, n.NIC.TapName) {
		t.Errorf("the caller's queue of tap %s is gone: its open taps are %v", n.NIC.TapName, taps)
	}
}
