package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// vmstateWith is a vmstate in the fake's format whose guest has a vsock
// device and the given devices (FullVmConfiguration fields, raw JSON).
func vmstateWith(devices string) []byte {
	return fmt.Appendf(nil, `{"memory_bytes":%d,"devices":{"vsock":{"guest_cid":3,"uds_path":"/old/v.sock"}%s}}`, drivertest.MemBytes, devices)
}

// TestRestoreRefusesImageHostDevices restores, against the fake
// Firecracker, snapshots whose vmstate attaches host files and taps the
// restore did not give: each fails before the guest runs, naming the
// device, and the Firecracker process is gone. HOSTFILE in a case's
// devices stands for a file of the test's (the fake opens drives' files).
func TestRestoreRefusesImageHostDevices(t *testing.T) {
	tests := []struct {
		name, devices, wantErr string
		nic                    bool
	}{
		{"drive", `,"drives":[{"drive_id":"rootfs","is_root_device":true,"path_on_host":"HOSTFILE","is_read_only":false}]`,
			`drives[0] (drive_id "rootfs") is backed by host file "HOSTFILE"`, false},
		{"vhost-user drive", `,"drives":[{"drive_id":"d","is_root_device":false,"socket":"/run/vhost.sock"}]`,
			`socket "/run/vhost.sock"`, false},
		{"pmem", `,"pmem":[{"id":"p","path_on_host":"/dev/sda"}]`, `pmem[0] (id "p") is backed by host file "/dev/sda"`, false},
		{"tap beside the restore's", `,"network-interfaces":[{"iface_id":"eth0","host_dev_name":"old0"},{"iface_id":"eth1","host_dev_name":"img-tap"}]`,
			`network-interfaces[1] (iface_id "eth1") is backed by tap "img-tap"`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, record := newDriver(t, apifake.Fake{})
			hostFile := filepath.Join(t.TempDir(), "host-file")
			if err := os.WriteFile(hostFile, []byte("host"), 0o600); err != nil {
				t.Fatal(err)
			}
			devices := strings.ReplaceAll(tt.devices, "HOSTFILE", hostFile)
			staged := drivertest.StageChain(t, Name, map[string][]byte{vmstateFile: vmstateWith(devices)})
			req := hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy}
			if tt.nic {
				n := drivertest.NewNet(t)
				req.NetNS, req.NIC = n.NS, n.NIC
			}
			v, err := d.Restore(ctx, req)
			if err == nil {
				v.Close()
				t.Fatal("restore of a snapshot with image-chosen host devices succeeded")
			}
			if want := strings.ReplaceAll(tt.wantErr, "HOSTFILE", hostFile); !strings.Contains(err.Error(), want) {
				t.Fatalf("restore error %v, want one containing %q", err, want)
			}
			if ops := apifake.Ops(t, record); slices.Contains(ops, "PATCH vm") {
				t.Fatalf("the guest was resumed: %v", ops)
			}
		})
	}
}

// TestRestoreOverridesVsock: the vsock socket the image names is replaced
// by this VM's.
func TestRestoreOverridesVsock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, _ := newDriver(t, apifake.Fake{})
	staged := drivertest.StageChain(t, Name, map[string][]byte{vmstateFile: vmstateWith("")})
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	drivertest.CheckAgent(t, ctx, v)
}

func TestRestoredConfigCheck(t *testing.T) {
	host := hostBackends{Vsock: "/run/vm1/v.sock", Taps: map[string]string{"eth1": "tap-b", "eth0": "tap-a"}}
	if got, want := host.overrides(), []networkOverride{{"eth0", "tap-a"}, {"eth1", "tap-b"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("overrides %v, want %v", got, want)
	}
	ok := restoredConfig{Net: []restoredNet{{"eth0", "tap-a"}}, Vsock: &restoredVsock{"/run/vm1/v.sock"}}
	if err := ok.check(host); err != nil {
		t.Errorf("a config using the restore's tap and vsock: %v", err)
	}
	ok.Vsock.UDSPath = "/other.sock"
	if err := ok.check(host); err == nil || !strings.Contains(err.Error(), `vsock is backed by socket "/other.sock"`) {
		t.Errorf("a foreign vsock socket: %v", err)
	}
	vsock := &restoredVsock{host.Vsock}
	slot := restoredDrive{DriveID: "rootfs", PathOnHost: rootfsPath, IsReadOnly: true}
	tests := []struct {
		name string
		cfg  restoredConfig
		host hostBackends
		want string
	}{
		{"rootfs slot", restoredConfig{Drives: []restoredDrive{slot}, Vsock: vsock}, host, ""},
		{"image's tap in a namespace of its own", restoredConfig{Net: []restoredNet{{"eth0", "img0"}}, Vsock: vsock},
			hostBackends{Vsock: host.Vsock, OwnNetNS: true}, ""},
		{"image's tap", restoredConfig{Net: []restoredNet{{"eth0", "img0"}}, Vsock: vsock}, hostBackends{Vsock: host.Vsock}, `backed by tap "img0"`},
		{"two rootfs slots", restoredConfig{Drives: []restoredDrive{slot, slot}, Vsock: vsock}, host, "drives[0] and drives[1] are both the rootfs slot"},
		{"writable rootfs slot", restoredConfig{Drives: []restoredDrive{{DriveID: "r", PathOnHost: rootfsPath}}, Vsock: vsock}, host, "is writable"},
		{"rootfs slot absolute", restoredConfig{Drives: []restoredDrive{{DriveID: "r", PathOnHost: "/" + rootfsPath, IsReadOnly: true}}, Vsock: vsock}, host,
			`backed by host file "/cocoon-rootfs"`},
		{"vhost-user rootfs slot", restoredConfig{Drives: []restoredDrive{{DriveID: "r", PathOnHost: rootfsPath, Socket: "/s", IsReadOnly: true}}, Vsock: vsock}, host,
			`socket "/s"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.check(tt.host)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("check = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestRestoreRefusesHostileVMState: the staged vmstate must be a regular
// file of bounded size, or Firecracker would block on it or read it whole.
func TestRestoreRefusesHostileVMState(t *testing.T) {
	tests := []struct {
		name    string
		hostile func(t *testing.T, path string)
		wantErr string
	}{
		{"FIFO", func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "FIFO, want a regular file"},
		{"symlink", func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc/hostname", p); err != nil {
				t.Fatal(err)
			}
		}, "a symbolic link"},
		{"huge", func(t *testing.T, p string) {
			if err := os.Truncate(p, 64<<20+1); err != nil {
				t.Fatal(err)
			}
		}, "larger than the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, _ := newDriver(t, apifake.Fake{})
			staged := stageChain(t)
			tt.hostile(t, filepath.Join(staged, vmstateFile))
			v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeMmap})
			if err == nil {
				v.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("restore error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
