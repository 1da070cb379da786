package firecracker

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// A network interface and a rootfs slot as a cocoon Firecracker snapshot
// records them (FullVmConfiguration fields of the fake's vmstate).
const (
	netIface   = `,"network-interfaces":[{"iface_id":"eth0","host_dev_name":"bake0","guest_mac":"02:c0:c0:00:00:01"}]`
	rootfsRO   = `,"drives":[{"drive_id":"rootfs","is_root_device":false,"is_read_only":true,"path_on_host":"cocoon-rootfs"}]`
	rootfsRW   = `,"drives":[{"drive_id":"rootfs","is_root_device":false,"is_read_only":false,"path_on_host":"cocoon-rootfs"}]`
	otherIface = `,"network-interfaces":[{"iface_id":"net1","host_dev_name":"bake0"}]`
)

func stageDevices(t testing.TB, devices string) string {
	return drivertest.StageChain(t, Name, map[string][]byte{vmstateFile: vmstateWith(devices)})
}

// TestRestoreNIC restores a snapshot with a network interface into the
// test's namespace with its tap: Firecracker runs in that namespace, the
// load overrides the interface's tap with the restore's, and Firecracker
// holds that tap, which it can only because the driver let go of the
// caller's queue.
func TestRestoreNIC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := drivertest.NewNet(t)
	d, record := newDriver(t, apifake.Fake{})
	staged := stageDevices(t, netIface)
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy,
		NetNS: n.NS, NIC: n.NIC})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if got, want := drivertest.NetNSOf(t, v.PID()), drivertest.NSInode(t, n.NS); got != want {
		t.Errorf("firecracker in netns %d, want the task's %d", got, want)
	}
	want := []any{map[string]any{"iface_id": nicIfaceID, "host_dev_name": n.NIC.TapName}}
	if got := apifake.Bodies(t, record, "PUT", "snapshot/load"); len(got) != 1 || !reflect.DeepEqual(got[0]["network_overrides"], want) {
		t.Errorf("snapshot/load bodies %v, want network_overrides %v", got, want)
	}
	if taps := drivertest.TapsOf(t, v.PID()); !slices.Equal(taps, []string{n.NIC.TapName}) {
		t.Errorf("firecracker holds taps %v, want %s", taps, n.NIC.TapName)
	}
	exercise(t, ctx, v, record, stagedDigest(t, staged))
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if links := n.Links(t); !slices.Equal(links, []string{n.NIC.TapName, "lo"}) {
		t.Errorf("links in the task's namespace %v, want lo and the tap", links)
	}
}

// TestRestoreNetworkWithoutNIC: without a NIC, Firecracker runs in a
// network namespace of its own, so the tap the snapshot names is made
// there, where nothing else is, and the VM is accepted.
func TestRestoreNetworkWithoutNIC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, record := newDriver(t, apifake.Fake{})
	staged := stageDevices(t, netIface)
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if got, ours := drivertest.NetNSOf(t, v.PID()), drivertest.NetNSOf(t, os.Getpid()); got == ours {
		t.Errorf("firecracker runs in our network namespace %d, want one of its own", got)
	}
	if links := drivertest.LinksOf(t, v.PID()); !slices.Equal(links, []string{"bake0", "lo"}) {
		t.Errorf("links in firecracker's namespace %v, want lo and the snapshot's tap", links)
	}
	if got := apifake.Bodies(t, record, "PUT", "snapshot/load"); len(got) != 1 || got[0]["network_overrides"] != nil {
		t.Errorf("snapshot/load bodies %v, want no network_overrides", got)
	}
	exercise(t, ctx, v, record, stagedDigest(t, staged))
}

// TestRestoreRootfs: the rootfs slot, recorded as rootfsPath, opens this
// restore's image (or an empty one) from the run directory.
func TestRestoreRootfs(t *testing.T) {
	image := filepath.Join(t.TempDir(), "rootfs.erofs")
	if err := os.WriteFile(image, make([]byte, 4096), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, disk := range []string{image, ""} {
		t.Run("disk="+disk, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, record := newDriver(t, apifake.Fake{})
			staged, run := stageDevices(t, rootfsRO), drivertest.RunDir(t)
			v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: hypervisor.ModeCopy, Disk: disk})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			want := disk
			if disk == "" {
				want = filepath.Join(run, rootfsPath)
				if fi, err := os.Lstat(want); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
					t.Errorf("empty rootfs image %v, %v: want an empty file", fi, err)
				}
			}
			if !drivertest.HoldsFile(t, v.PID(), want) {
				t.Errorf("firecracker does not hold %s open", want)
			}
			exercise(t, ctx, v, record, stagedDigest(t, staged))
		})
	}
}

// TestRestoreRefusesSnapshotDevices: snapshot devices a restore cannot
// back fail the restore once loaded, before the guest runs, and nothing of
// the VM is left.
func TestRestoreRefusesSnapshotDevices(t *testing.T) {
	image := filepath.Join(t.TempDir(), "rootfs.erofs")
	if err := os.WriteFile(image, make([]byte, 4096), 0o444); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, devices string
		nic           bool
		disk          string
		want          string
	}{
		{"interface not the NIC's", otherIface, true, "", `behind network interface "eth0": PUT /snapshot/load: status 400: Load snapshot error: unknown network device "eth0"`},
		{"writable rootfs slot", rootfsRW, false, image, `drives[0] (drive_id "rootfs"), the rootfs slot, is writable`},
		{"two interfaces", `,"network-interfaces":[{"iface_id":"eth0","host_dev_name":"bake0"},{"iface_id":"eth1","host_dev_name":"bake1"}]`, true, "",
			`network-interfaces[1] (iface_id "eth1") is backed by tap "bake1"`},
		{"disk without a rootfs slot", netIface, true, image, `the snapshot has no rootfs slot (a drive recorded as "cocoon-rootfs") to put ` + image},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := drivertest.NewNet(t)
			d, record := newDriver(t, apifake.Fake{})
			req := hypervisor.RestoreRequest{StagedDir: stageDevices(t, tt.devices), RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy, Disk: tt.disk}
			if tt.nic {
				req.NetNS, req.NIC = n.NS, n.NIC
			}
			v, err := d.Restore(context.Background(), req)
			if err == nil {
				v.Close()
				t.Fatal("restore succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
			if ops := apifake.Ops(t, record); slices.Contains(ops, "PATCH vm") {
				t.Errorf("the guest was resumed: %v", ops)
			}
			if _, err := os.Stat(req.RunDir); !os.IsNotExist(err) {
				t.Errorf("run dir left: %v", err)
			}
			if links := n.Links(t); !slices.Equal(links, []string{n.NIC.TapName, "lo"}) {
				t.Errorf("links in the task's namespace %v, want lo and the tap", links)
			}
		})
	}
}

func TestRestoreRefusesBadAttachments(t *testing.T) {
	drivertest.RefusesBadAttachments(t, drivertest.BadAttachments{
		Driver: func(t testing.TB) (hypervisor.Driver, string) { return newDriver(t, apifake.Fake{}) },
		Stage:  func(t testing.TB) string { return stageDevices(t, netIface+rootfsRO) },
	})
}
