package cloudhypervisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/drivertest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/apifake"
)

// withField returns testConfig with the top-level field key set to value
// (raw JSON).
func withField(t *testing.T, key, value string) string {
	t.Helper()
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal([]byte(testConfig), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg[key] = json.RawMessage(value)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPatchConfigRefusesHostPaths(t *testing.T) {
	tests := []struct {
		name, key, value string
		host             hostBackends
		wantErr          string
	}{
		{"disk image beside the rootfs slot", "disks", `[{"id":"_disk0","path":"/r","serial":"cocoon-rootfs"},{"path":"/etc/shadow"}]`, hostBackends{Disk: "/r"},
			"disks[1]: the snapshot has a device this restore gives no host path for"},
		{"vhost-user disk", "disks", `[{"path":"/x","vhost_user":true,"vhost_socket":"/run/vhost.sock"}]`, hostBackends{Disk: "/r"}, "disks[0].vhost_socket"},
		{"disk following backing files", "disks", `[{"path":"/x","backing_files":true}]`, hostBackends{Disk: "/r"}, "disks[0].backing_files"},
		{"tap in a namespace without one from the restore", "net", `[{"tap":"tap-of-another-vm"}]`, hostBackends{NetNS: true},
			"net[0]: the restore gives a network namespace but no tap"},
		{"net fds", "net", `[{"fds":[3,4]}]`, hostBackends{Tap: "t"}, "net[0].fds"},
		{"vhost-user net", "net", `[{"vhost_user":true,"vhost_socket":"/s"}]`, hostBackends{Tap: "t"}, "net[0].vhost_socket"},
		{"virtio-fs", "fs", `[{"tag":"x","socket":"/run/virtiofsd.sock","num_queues":1,"queue_size":1024}]`, hostBackends{}, "fs = "},
		{"pmem", "pmem", `[{"file":"/dev/sda"}]`, hostBackends{}, "pmem = "},
		{"vfio device", "devices", `[{"path":"/sys/bus/pci/devices/0000:00:01.0"}]`, hostBackends{}, "devices = "},
		{"user device", "user_devices", `[{"socket":"/s"}]`, hostBackends{}, "user_devices = "},
		{"vdpa", "vdpa", `[{"path":"/dev/vhost-vdpa-0","num_queues":1}]`, hostBackends{}, "vdpa = "},
		{"tpm", "tpm", `{"socket":"/run/swtpm.sock"}`, hostBackends{}, "tpm = "},
		{"generic vhost-user", "generic_vhost_user", `[{"socket":"/s","queue_sizes":[1],"device_type":1}]`, hostBackends{}, "generic_vhost_user = "},
		{"generic vhost-user (spec name)", "generic-vhost-user", `[{"socket":"/s"}]`, hostBackends{}, "generic-vhost-user = "},
		{"landlock rules", "landlock_rules", `[{"path":"/","access":"rw"}]`, hostBackends{}, "landlock_rules = "},
		{"ivshmem", "ivshmem", `{"path":"/dev/shm/x","size":4096}`, hostBackends{}, "ivshmem = "},
		{"memory zone file", "memory", `{"size":65536,"zones":[{"id":"z","size":65536,"file":"/etc/shadow"}]}`, hostBackends{}, "memory.zones[0].file"},
		{"fw_cfg file", "payload", `{"fw_cfg_config":{"items":{"item_list":[{"name":"opt/x","file":"/etc/shadow"}]}}}`, hostBackends{}, "payload.fw_cfg_config.items.item_list[0].file"},
		{"iommufd fd", "platform", `{"iommufd_fd":3}`, hostBackends{}, "platform.iommufd_fd"},
		{"unknown top-level field with a path", "future_disk", `{"path":"/etc/shadow"}`, hostBackends{}, "future_disk: an unknown field holding a string"},
		{"unknown field of a known device", "vsock", `{"cid":3,"socket":"/s","future_path":"/etc/shadow"}`, hostBackends{}, "vsock.future_path: an unknown field"},
		{"tap without a network device", "net", `null`, hostBackends{Tap: "t"}, `the snapshot has no network device to put tap "t" behind`},
		{"two network devices", "net", `[{"id":"a"},{"id":"b"}]`, hostBackends{Tap: "t"}, "the snapshot has 2 network devices"},
		{"multi-queue network device", "net", `[{"num_queues":4}]`, hostBackends{Tap: "t"}, "net[0].num_queues = 4: the tap a restore gives has one queue"},
		{"disk without a rootfs slot", "disks", `null`, hostBackends{Disk: "/r"}, `the snapshot has no rootfs slot (a disk with serial "cocoon-rootfs")`},
		{"two disks, no rootfs serial", "disks", `[{"id":"a","path":"/a"},{"id":"b","path":"/b"}]`, hostBackends{Disk: "/r"}, "2 disks, none with serial"},
		{"two rootfs slots", "disks", `[{"id":"a","serial":"cocoon-rootfs"},{"id":"b","serial":"cocoon-rootfs"}]`, hostBackends{Disk: "/r"}, "disks[0] and disks[1] both have serial"},
		{"rootfs slot without id", "disks", `[{"path":"/a"}]`, hostBackends{Disk: "/r"}, "disks[0] (the rootfs slot) has no id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := patchConfig([]byte(withField(t, tt.key, tt.value)), "/run/vm1", tt.host)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("patchConfig error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestPatchConfigRewritesHostPaths(t *testing.T) {
	tests := []struct {
		name, key, value string
		host             hostBackends
		want             string // the field after patching, as JSON
	}{
		{"tap from the restore", "net", `[{"tap":"tap-of-another-vm","ip":"10.0.0.1","mask":"255.0.0.0","host_mac":"02:00:00:00:00:01","mac":"02:00:00:00:00:02","id":"net0"}]`,
			hostBackends{Tap: "tap-ctr1"}, `[{"host_mac":null,"id":"net0","ip":null,"mac":"02:00:00:00:00:02","mask":null,"tap":"tap-ctr1"}]`},
		{"tap of its own without a NIC", "net", `[{"tap":"tap-of-another-vm","id":"net0","num_queues":2}]`, hostBackends{}, `[{"id":"net0","num_queues":2,"tap":null}]`},
		{"rootfs disk from the restore", "disks", `[{"id":"_disk0","path":"/etc/shadow","readonly":false,"image_type":"Qcow2","queue_affinity":[{"queue_index":0,"host_cpus":[1]}]}]`,
			hostBackends{Disk: "/images/rootfs.erofs"}, `[{"id":"_disk0","image_type":"Raw","path":"/images/rootfs.erofs","queue_affinity":null,"readonly":true}]`},
		{"empty rootfs slot", "disks", `[{"id":"_disk0","path":"/etc/shadow","serial":"cocoon-rootfs"}]`,
			hostBackends{}, `[{"id":"_disk0","image_type":"Raw","path":"/run/vm1/empty-rootfs.img","readonly":true,"serial":"cocoon-rootfs"}]`},
		{"entropy source", "rng", `{"src":"/etc/shadow"}`, hostBackends{}, `{"src":"/dev/urandom"}`},
		{"debug console", "debug_console", `{"file":"/etc/cron.d/x","mode":"File"}`, hostBackends{}, `{"file":"/run/vm1/debug-console.log","mode":"File"}`},
		{"console file", "console", `{"file":"/etc/passwd","mode":"File"}`, hostBackends{}, `{"file":"/run/vm1/console.log","mode":"File"}`},
		{"payload files", "payload", `{"firmware":"/f","kernel":"/k","initramfs":"/i","igvm":"/g","cmdline":"quiet"}`, hostBackends{},
			`{"cmdline":"quiet","firmware":null,"igvm":null,"initramfs":null,"kernel":null}`},
		{"host cpu pinning", "cpus", `{"boot_vcpus":1,"max_vcpus":1,"affinity":[{"vcpu":0,"host_cpus":[0]}]}`, hostBackends{},
			`{"affinity":null,"boot_vcpus":1,"max_vcpus":1}`},
		{"host numa node", "memory", `{"size":65536,"zones":[{"id":"z","size":65536,"host_numa_node":1}]}`, hostBackends{},
			`{"size":65536,"zones":[{"host_numa_node":null,"id":"z","size":65536}]}`},
		{"unknown field without strings", "future", `{"n":[1,2],"on":true}`, hostBackends{}, `{"n":[1,2],"on":true}`},
		{"empty refused device list", "fs", `[]`, hostBackends{}, `[]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := patchConfig([]byte(withField(t, tt.key, tt.value)), "/run/vm1", tt.host)
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]json.RawMessage
			if err := json.Unmarshal(p.config, &cfg); err != nil {
				t.Fatal(err)
			}
			if got := string(cfg[tt.key]); got != tt.want {
				t.Fatalf("%s after patching:\n got %s\nwant %s", tt.key, got, tt.want)
			}
		})
	}
}

// TestSchemaCoversSpec: every VmConfig property of both API specs, at any
// depth, is classified in vmConfigSchema, so no field a newer spec adds
// reaches Cloud Hypervisor unexamined by a reader of the table.
func TestSchemaCoversSpec(t *testing.T) {
	for _, spec := range []string{apifake.SpecCH, apifake.SpecCHFork} {
		doc, err := openapi3.NewLoader().LoadFromFile(apifake.SpecPath(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		vmConfig := doc.Components.Schemas["VmConfig"]
		if vmConfig == nil {
			t.Fatalf("%s: no VmConfig schema", spec)
		}
		checkCovered(t, spec, "", vmConfig.Value, vmConfigSchema)
	}
}

func checkCovered(t *testing.T, spec, path string, s *openapi3.Schema, f field) {
	t.Helper()
	if f.fields == nil {
		return // one rule for the whole value
	}
	if s.Items != nil {
		s = s.Items.Value
	}
	for name, prop := range s.Properties {
		p := name
		if path != "" {
			p = path + "." + name
		}
		child, ok := f.fields[name]
		if !ok {
			t.Errorf("%s: VmConfig field %s is not in vmConfigSchema", spec, p)
			continue
		}
		checkCovered(t, spec, p, prop.Value, child)
	}
}

// hostileConfigs are config.json files an image may carry, each naming a
// host resource the restore must not hand to Cloud Hypervisor.
var hostileConfigs = []struct{ name, key, value, wantErr string }{
	{"disk", "disks", `[{"path":"/etc/shadow"}]`, "disks[0]"},
	{"second disk", "disks", `[{"id":"_disk0","path":"/x","serial":"cocoon-rootfs"},{"id":"_disk1","path":"/etc/shadow"}]`, "disks[1]"},
	{"vhost-user net", "net", `[{"vhost_user":true,"vhost_socket":"/run/vhost-net.sock"}]`, "net[0].vhost_socket"},
	{"virtio-fs", "fs", `[{"tag":"root","socket":"/run/virtiofsd.sock","num_queues":1,"queue_size":1024}]`, "fs = "},
	{"pmem", "pmem", `[{"file":"/dev/sda"}]`, "pmem = "},
	{"vfio device", "devices", `[{"path":"/sys/bus/pci/devices/0000:00:01.0"}]`, "devices = "},
	{"tpm", "tpm", `{"socket":"/run/swtpm.sock"}`, "tpm = "},
}

// TestRestoreRefusesImageHostPaths restores, against the fake Cloud
// Hypervisor, snapshots whose config.json names host resources: each
// restore fails naming the field before vm.restore is sent.
func TestRestoreRefusesImageHostPaths(t *testing.T) {
	for _, tt := range hostileConfigs {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, record := newDriver(t, apifake.SpecCH, "probe")
			staged := drivertest.StageChain(t, Name, map[string][]byte{
				configFile: []byte(withField(t, tt.key, tt.value)),
				stateFile:  []byte(`{"snapshot_data":{}}`),
			})
			v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy})
			if err == nil {
				v.Close()
				t.Fatalf("restore of a config naming host %s succeeded", tt.name)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("restore error %v, want one naming %q", err, tt.wantErr)
			}
			// The capability probe restores an empty dir; no restore may
			// name the staged one.
			for _, b := range apifake.Bodies(t, record, "PUT", "vm.restore") {
				if src, _ := b["source_url"].(string); strings.Contains(src, staged) {
					t.Fatalf("vm.restore was sent: %v", b)
				}
			}
		})
	}
}

// TestRestoreConfinesPaths restores a snapshot whose config.json names
// host files for the devices cocoon rewrites, and checks the config Cloud
// Hypervisor got names nothing on the host outside the VM's run directory
// but the entropy source.
func TestRestoreConfinesPaths(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, _ := newDriver(t, apifake.SpecCH, "probe")
	cfg := withField(t, "debug_console", `{"file":"/etc/cron.d/evil","mode":"File"}`)
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(cfg), &m); err != nil {
		t.Fatal(err)
	}
	m["console"] = json.RawMessage(`{"file":"/etc/passwd","mode":"File"}`)
	m["rng"] = json.RawMessage(`{"src":"/etc/shadow"}`)
	m["cpus"] = json.RawMessage(`{"boot_vcpus":1,"max_vcpus":1,"affinity":[{"vcpu":0,"host_cpus":[0]}]}`)
	b, _ := json.Marshal(m)
	staged := drivertest.StageChain(t, Name, map[string][]byte{configFile: b, stateFile: []byte(`{"snapshot_data":{}}`)})
	run := drivertest.RunDir(t)
	v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: run, Mode: hypervisor.ModeOnDemand})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	dirs := restoreDirs(t, staged)
	if len(dirs) != 1 {
		t.Fatalf("restore dirs %v", dirs)
	}
	given, err := os.ReadFile(filepath.Join(dirs[0], configFile))
	if err != nil {
		t.Fatal(err)
	}
	var tree any
	if err := json.Unmarshal(given, &tree); err != nil {
		t.Fatal(err)
	}
	for _, s := range jsonStrings(tree) {
		if strings.HasPrefix(s, "/") && !strings.HasPrefix(s, run+"/") && s != "/dev/urandom" {
			t.Errorf("config.json given to Cloud Hypervisor names %s", s)
		}
	}
	if strings.Contains(string(given), "host_cpus") {
		t.Errorf("host CPU pinning reached Cloud Hypervisor: %s", given)
	}
}

func jsonStrings(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, jsonStrings(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for _, e := range v {
			out = append(out, jsonStrings(e)...)
		}
		return out
	}
	return nil
}

// TestRestoreBoundsStateFiles: staged config.json and state.json must be
// regular files of bounded size, read without blocking.
func TestRestoreBoundsStateFiles(t *testing.T) {
	tests := []struct {
		name, file string
		hostile    func(t *testing.T, path string)
		wantErr    string
	}{
		{"state.json is a FIFO", stateFile, mkfifo, "FIFO, want a regular file"},
		{"config.json is a FIFO", configFile, mkfifo, "FIFO, want a regular file"},
		{"state.json is a symlink", stateFile, func(t *testing.T, p string) { relink(t, "/etc/hostname", p) }, "a symbolic link"},
		{"state.json is huge", stateFile, func(t *testing.T, p string) { grow(t, p, chain.MaxStateFile+1) }, "larger than the"},
		{"config.json is huge", configFile, func(t *testing.T, p string) { grow(t, p, maxConfigJSON+1) }, "larger than the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, _ := newDriver(t, apifake.SpecCH, "probe")
			staged := stageChain(t)
			tt.hostile(t, filepath.Join(staged, tt.file))
			done := make(chan error, 1)
			go func() {
				v, err := d.Restore(ctx, hypervisor.RestoreRequest{StagedDir: staged, RunDir: drivertest.RunDir(t), Mode: hypervisor.ModeCopy})
				if err == nil {
					v.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), tt.file) {
					t.Fatalf("restore error %v, want one naming %s and containing %q", err, tt.file, tt.wantErr)
				}
			case <-time.After(45 * time.Second):
				t.Fatal("restore still runs after 45s")
			}
		})
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func relink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// grow makes path a sparse file of size bytes.
func grow(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}
