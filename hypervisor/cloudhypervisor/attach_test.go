package cloudhypervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// A network device and a rootfs slot as Cloud Hypervisor records them at
// bake: the tap and image named are the bake host's.
const (
	netDevice  = `[{"id":"_net0","tap":"bake0","mac":"02:c0:c0:00:00:01","host_mac":"02:00:00:00:00:09","num_queues":2,"queue_size":256}]`
	rootfsDisk = `[{"id":"_disk0","path":"/bake/empty.img","serial":"cocoon-rootfs","readonly":false,"image_type":"Unknown","num_queues":1,"queue_size":128}]`
)

// blockFeatures is a virtio-block state's avail_features: above 2^53, so
// a float round trip would change it.
const blockFeatures = "18446744073709551615"

// stateWithDisk is a state.json (v53.0's Snapshot) whose device manager
// holds the virtio-block state of disk _disk0, of sectors sectors.
func stateWithDisk(sectors int) string {
	block := fmt.Sprintf(`{"disk_path":"/bake/empty.img","disk_nsectors":%d,"avail_features":%s,"acked_features":0,`+
		`"config":{"capacity":%d,"size_max":0,"seg_max":126,"blk_size":512}}`, sectors, blockFeatures, sectors)
	b, _ := json.Marshal(block)
	return `{"snapshots":{"cpu-manager":{"snapshots":{},"snapshot_data":{"state":"{}"}},` +
		`"device-manager":{"snapshots":{"_disk0":{"snapshots":{},"snapshot_data":{"state":` + string(b) + `}},` +
		`"_virtio-pci-_disk0":{"snapshots":{},"snapshot_data":{"state":"{\"cap_pci_cfg\":[]}"}}},` +
		`"snapshot_data":{"state":"{\"device_tree\":{}}"}}},"snapshot_data":{"state":"{}"}}`
}

// configWith is testConfig with each top-level field of kv (name, raw
// JSON value, ...) set.
func configWith(t testing.TB, kv ...string) string {
	t.Helper()
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal([]byte(testConfig), &cfg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		cfg[kv[i]] = json.RawMessage(kv[i+1])
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func stageWith(t testing.TB, config, state string) string {
	return drivertest.StageChain(t, Name, map[string][]byte{configFile: []byte(config), stateFile: []byte(state)})
}

// stageAttachable stages a snapshot with a network device and a rootfs slot.
func stageAttachable(t testing.TB) string {
	return stageWith(t, configWith(t, "net", netDevice, "disks", rootfsDisk), stateWithDisk(0))
}

// given reads the config.json and state.json the restore of staged gave
// Cloud Hypervisor.
func given(t *testing.T, staged string) (cfg map[string]json.RawMessage, state []byte) {
	t.Helper()
	dirs := restoreDirs(t, staged)
	if len(dirs) != 1 {
		t.Fatalf("restore dirs %v, want one", dirs)
	}
	raw, err := os.ReadFile(filepath.Join(dirs[0], configFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if state, err = os.ReadFile(filepath.Join(dirs[0], stateFile)); err != nil {
		t.Fatal(err)
	}
	return cfg, state
}

// device decodes the first element of cfg[name].
func device(t *testing.T, cfg map[string]json.RawMessage, name string) map[string]any {
	t.Helper()
	var devs []map[string]any
	if err := json.Unmarshal(cfg[name], &devs); err != nil || len(devs) != 1 {
		t.Fatalf("%s = %s (%v), want one device", name, cfg[name], err)
	}
	return devs[0]
}

// TestRestoreNIC restores a snapshot with a network device into the
// test's namespace with its tap: Cloud Hypervisor runs in that namespace
// and opens that tap by name, which it can only because the driver let go
// of the caller's queue; the tap is the caller's again once the VM is gone.
func TestRestoreNIC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := drivertest.NewNet(t)
	d, record := newDriver(t, apifake.SpecCH, "no")
	staged := stageWith(t, configWith(t, "net", netDevice), `{"snapshot_data":{}}`)
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy,
		NetNS: n.NS, NIC: n.NIC})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if got, want := drivertest.NetNSOf(t, v.PID()), drivertest.NSInode(t, n.NS); got != want {
		t.Errorf("cloud hypervisor in netns %d, want the task's %d", got, want)
	}
	cfg, _ := given(t, staged)
	if got := device(t, cfg, "net"); got["tap"] != n.NIC.TapName || got["host_mac"] != nil || got["mac"] != "02:c0:c0:00:00:01" {
		t.Errorf("net[0] given %v, want tap %s, the snapshot's mac and no host_mac", got, n.NIC.TapName)
	}
	if taps := drivertest.TapsOf(t, v.PID()); len(taps) != 1 || taps[0] != n.NIC.TapName {
		t.Errorf("cloud hypervisor holds taps %v, want %s", taps, n.NIC.TapName)
	}
	exercise(t, ctx, v, record)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if links := n.Links(t); !slices.Equal(links, []string{n.NIC.TapName, "lo"}) {
		t.Errorf("links in the task's namespace %v, want lo and the tap", links)
	}
}

// TestRestoreNetworkWithoutNIC: a snapshot's network device without a NIC
// from the restore gets a tap Cloud Hypervisor makes in a network
// namespace of its own, never the image's tap and nothing on the host.
func TestRestoreNetworkWithoutNIC(t *testing.T) {
	testenv.RequireRoot(t) // a network namespace of its own
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, record := newDriver(t, apifake.SpecCH, "no")
	staged := stageWith(t, configWith(t, "net", netDevice), `{"snapshot_data":{}}`)
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if got, ours := drivertest.NetNSOf(t, v.PID()), drivertest.NetNSOf(t, os.Getpid()); got == ours {
		t.Errorf("cloud hypervisor runs in our network namespace %d, want one of its own", got)
	}
	cfg, _ := given(t, staged)
	if got := device(t, cfg, "net"); got["tap"] != nil {
		t.Errorf("net[0] given %v, want tap null", got)
	}
	if links := drivertest.LinksOf(t, v.PID()); strings.Join(links, ",") != "lo,vmtap0" {
		t.Errorf("links in cloud hypervisor's namespace %v, want lo and the tap it made", links)
	}
	exercise(t, ctx, v, record)
}

// TestRestoreRootfs backs the snapshot's rootfs slot with the restore's
// image, or with an empty one, read-only and raw, and sets the slot's
// recorded capacity to the image's; two VMs share one image.
func TestRestoreRootfs(t *testing.T) {
	image := filepath.Join(t.TempDir(), "rootfs.erofs")
	if err := os.WriteFile(image, make([]byte, 5*4096), 0o444); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		disk    string
		sectors int64
	}{
		{"image", image, 5 * 4096 / 512},
		{"empty", "", emptyRootfsSize / 512},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, record := newDriver(t, apifake.SpecCH, "no")
			staged, run := stageWith(t, configWith(t, "disks", rootfsDisk), stateWithDisk(1)), drivertest.RunDir(t)
			v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: hypervisor.ModeCopy, Disk: tt.disk})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			want := tt.disk
			if want == "" {
				want = filepath.Join(run, emptyRootfs)
			}
			cfg, state := given(t, staged)
			if got := device(t, cfg, "disks"); got["path"] != want || got["readonly"] != true || got["image_type"] != "Raw" || got["serial"] != hypervisor.RootfsSerial {
				t.Errorf("disks[0] given %v, want path %s, readonly, raw, the slot's serial", got, want)
			}
			if !drivertest.HoldsFile(t, v.PID(), want) {
				t.Errorf("cloud hypervisor does not hold %s open", want)
			}
			checkBlockState(t, state, tt.sectors)
			exercise(t, ctx, v, record)
		})
	}
	t.Run("shared", func(t *testing.T) {
		d, _ := newDriver(t, apifake.SpecCH, "no")
		for range 2 {
			staged := stageWith(t, configWith(t, "disks", rootfsDisk), stateWithDisk(1))
			v, err := d.Restore(context.Background(), hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy, Disk: image})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
		}
	})
}

// checkBlockState checks the _disk0 state in state records sectors, and
// the rest as stateWithDisk wrote it.
func checkBlockState(t *testing.T, state []byte, sectors int64) {
	t.Helper()
	var top struct {
		Snapshots map[string]struct {
			Snapshots map[string]struct {
				SnapshotData struct{ State string } `json:"snapshot_data"`
			} `json:"snapshots"`
		} `json:"snapshots"`
	}
	if err := json.Unmarshal(state, &top); err != nil {
		t.Fatal(err)
	}
	dm := top.Snapshots["device-manager"].Snapshots
	if len(dm) != 2 || dm["_virtio-pci-_disk0"].SnapshotData.State != `{"cap_pci_cfg":[]}` {
		t.Errorf("device manager snapshots %+v, want both devices kept", dm)
	}
	raw := dm["_disk0"].SnapshotData.State
	want := fmt.Sprintf(`{"acked_features":0,"avail_features":%s,"config":{"blk_size":512,"capacity":%d,"seg_max":126,"size_max":0},`+
		`"disk_nsectors":%d,"disk_path":"/bake/empty.img"}`, blockFeatures, sectors, sectors)
	if raw != want {
		t.Errorf("rootfs slot state given\n got %s\nwant %s", raw, want)
	}
}

func TestRestoreRefusesBadAttachments(t *testing.T) {
	drivertest.RefusesBadAttachments(t, drivertest.BadAttachments{
		Driver: func(t testing.TB) (hypervisor.Driver, string) { return newDriver(t, apifake.SpecCH, "no") },
		Stage:  stageAttachable,
	})
}

// TestRestoreRefusesSnapshotDevices: devices of the snapshot a restore
// cannot back fail before Cloud Hypervisor starts, the caller's tap kept.
func TestRestoreRefusesSnapshotDevices(t *testing.T) {
	n := drivertest.NewNet(t)
	image := filepath.Join(t.TempDir(), "rootfs.erofs")
	if err := os.WriteFile(image, make([]byte, 4096), 0o444); err != nil {
		t.Fatal(err)
	}
	twoNets := `[{"id":"_net0","tap":"a"},{"id":"_net1","tap":"b"}]`
	tests := []struct {
		name, config string
		nic          bool
		disk         string
		want         string
	}{
		{"two network devices", configWith(t, "net", twoNets), true, "", "the snapshot has 2 network devices"},
		{"network device, namespace but no tap", configWith(t, "net", netDevice), false, "", "gives a network namespace but no tap"},
		{"tap but no network device", testConfig, true, "", "no network device to put tap"},
		{"disk but no rootfs slot", testConfig, false, image, "no rootfs slot"},
		{"a disk beside the rootfs slot", configWith(t, "disks", `[{"id":"_disk0","path":"/a","serial":"cocoon-rootfs"},{"id":"_disk1","path":"/b"}]`),
			false, image, "disks[1]: the snapshot has a device this restore gives no host path for"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, record := newDriver(t, apifake.SpecCH, "no")
			staged := stageWith(t, tt.config, stateWithDisk(0))
			req := hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy, NetNS: n.NS, Disk: tt.disk}
			if tt.nic {
				req.NIC = n.NIC
			}
			v, err := d.Restore(context.Background(), req)
			if err == nil {
				v.Close()
				t.Fatal("restore succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
			if pids := apifake.PIDs(t, record); len(pids) != 0 {
				t.Errorf("fake pids %v, want none started", pids)
			}
			if left := restoreDirs(t, staged); len(left) != 0 {
				t.Errorf("restore dirs left: %v", left)
			}
			if _, err := os.Stat(req.RunDir); !os.IsNotExist(err) {
				t.Errorf("run dir left: %v", err)
			}
			if taps := drivertest.TapsOf(t, os.Getpid()); !slices.Contains(taps, n.NIC.TapName) {
				t.Errorf("the caller's queue of tap %s is gone: its open taps are %v", n.NIC.TapName, taps)
			}
		})
	}
}

func TestSetRootfsSize(t *testing.T) {
	slot := &rootfsSlot{id: "_disk0", size: 3 * 512}
	out, err := setRootfsSize([]byte(stateWithDisk(7)), slot)
	if err != nil {
		t.Fatal(err)
	}
	checkBlockState(t, out, 3)
	tests := []struct{ name, state, want string }{
		{"no device manager", `{"snapshots":{}}`, "no device-manager"},
		{"no such device", strings.ReplaceAll(stateWithDisk(1), `"_disk0"`, `"_disk1"`), "no _disk0.snapshot_data.state"},
		{"state not a string", `{"snapshots":{"device-manager":{"snapshots":{"_disk0":{"snapshot_data":{"state":{}}}}}}}`, "want the device state as a JSON string"},
		{"not a block device", `{"snapshots":{"device-manager":{"snapshots":{"_disk0":{"snapshot_data":{"state":"{\"cid\":3}"}}}}}}`, "not a virtio-block state: no disk_nsectors"},
		{"not json", `{`, "want an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := setRootfsSize([]byte(tt.state), slot); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
