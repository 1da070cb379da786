package qemu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// fakeLink writes a one-link QEMU chain whose qemu.json is shape (1 MiB
// of guest memory, one vCPU) and whose device state is junk: enough for
// every check a restore makes before QEMU starts.
func fakeLink(t *testing.T, shape Shape) string {
	t.Helper()
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Mkdir(link, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteShape(link, shape); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(link, StateFile), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(dir, "memory")
	if err := os.WriteFile(mem, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	meta := chain.Meta{Hypervisor: Name, GuestOS: "linux", VCPUs: 1, StateFiles: []string{StateFile, ShapeFile}}
	if _, err := chain.WriteFull(context.Background(), mem, meta, link); err != nil {
		t.Fatal(err)
	}
	return link
}

// tcgShape is a valid shape baked on a TCG host with the default CPU.
func tcgShape() Shape {
	return Shape{Version: shapeVersion, Machine: machineType, Accel: accelTCG, CPU: "max",
		VCPUs: 1, MemoryBytes: 1 << 20, Devices: devices}
}

// replaceShape swaps the staged qemu.json for what make creates at path.
func replaceShape(t *testing.T, make func(path string) error) func(string) {
	return func(staged string) {
		path := filepath.Join(staged, ShapeFile)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := make(path); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRestoreRefusesBeforeStart checks what a restore refuses before QEMU
// runs: a machine shape QEMU must not be given (a hostile or foreign
// qemu.json: issue 13 rows 7 and 8) and attachments QEMU could not use.
// The fake QEMU records whether it ran.
func TestRestoreRefusesBeforeStart(t *testing.T) {
	notTap, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer notTap.Close()
	notNS, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	defer notNS.Close()
	tests := []struct {
		name   string
		shape  func(*Shape)
		staged func(t *testing.T) func(string)
		req    hypervisor.RestoreRequest
		want   string
	}{
		{name: "baked under kvm", shape: func(s *Shape) { s.Accel = accelKVM }, want: `snapshot baked with accel "kvm" and cpu "max", but this host runs accel "tcg"`},
		{name: "image chooses cpu flags", shape: func(s *Shape) { s.CPU = "max,+vmx,x-evil=on" }, want: `cpu "max,+vmx,x-evil=on", but this host runs accel "tcg" (forced by config) and cpu "max"`},
		{name: "version 1", shape: func(s *Shape) { s.Version, s.Devices = 1, devices[:2] }, want: "re-bake it"},
		{name: "huge qemu.json", staged: func(t *testing.T) func(string) {
			return replaceShape(t, func(p string) error { return sparseFile(p, 1<<30) })
		}, want: "is 1073741824 bytes: want at most 65536"},
		{name: "qemu.json a fifo", staged: func(t *testing.T) func(string) {
			return replaceShape(t, func(p string) error { return syscall.Mkfifo(p, 0o644) })
		}, want: "is not a regular file"},
		{name: "qemu.json a symlink", staged: func(t *testing.T) func(string) {
			return replaceShape(t, func(p string) error { return os.Symlink("/etc/hostname", p) })
		}, want: "is a symlink"},
		{name: "nic without a tap file", req: hypervisor.RestoreRequest{NIC: &hypervisor.NIC{TapName: "tap0"}}, want: `nic "tap0" has no tap file`},
		{name: "nic not a tap", req: hypervisor.RestoreRequest{NIC: &hypervisor.NIC{TapName: "tap0", TapFile: notTap}}, want: "TUNGETIFF"},
		{name: "missing disk", req: hypervisor.RestoreRequest{Disk: "/nonexistent/rootfs.erofs"}, want: "rootfs disk: stat /nonexistent/rootfs.erofs"},
		{name: "disk a directory", req: hypervisor.RestoreRequest{Disk: "/"}, want: "rootfs disk / is not a regular file"},
		{name: "netns of another type", req: hypervisor.RestoreRequest{NetNS: notNS}, want: "is a namespace of another type"},
		{name: "netns not a namespace", req: hypervisor.RestoreRequest{NetNS: notTap}, want: "want an nsfs file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shape := tcgShape()
			if tt.shape != nil {
				tt.shape(&shape)
			}
			root := t.TempDir()
			d := New(config.QEMU{Binary: fakeBinary(t, root, "exit 1"), Accel: accelTCG})
			s := newStager(t, root, fakeLink(t, shape))
			req := tt.req
			req.StagedDir, req.RunDir, req.Mode = s.stage(), s.runDir(), hypervisor.ModeMmap
			if tt.staged != nil {
				tt.staged(t)(req.StagedDir)
			}
			v, err := d.Restore(testContext(t, 10*time.Second), req)
			if err == nil {
				v.Close()
				t.Fatal("restore succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %q, want it to contain %q", err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(root, "pid")); err == nil {
				t.Error("qemu was started")
			}
			assertGone(t, 0, req.RunDir)
		})
	}
}

// sparseFile creates path as a file of size bytes that takes no space.
func sparseFile(path string, size int64) error {
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return err
	}
	return os.Truncate(path, size)
}

// TestReadShapeBounded reads qemu.json the way an image's file must be
// read: a regular file, not followed through a symlink, not waited on,
// bounded in size.
func TestReadShapeBounded(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := WriteShape(dir, tcgShape()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, ShapeFile), good); err != nil {
		t.Fatal(err)
	}
	padded, err := json.Marshal(tcgShape())
	if err != nil {
		t.Fatal(err)
	}
	padded = append(padded, strings.Repeat(" ", maxShapeBytes)...)
	tests := []struct {
		name string
		make func(path string) error
		want string
	}{
		{"regular", func(p string) error { return os.Link(good, p) }, ""},
		{"symlink to a good one", func(p string) error { return os.Symlink(good, p) }, "is a symlink"},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }, "is not a regular file"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o755) }, "is not a regular file"},
		{"a byte too big", func(p string) error { return os.WriteFile(p, padded[:maxShapeBytes+1], 0o644) }, "want at most 65536"},
		{"sparse 64 GiB", func(p string) error { return sparseFile(p, 64<<30) }, "is 68719476736 bytes: want at most 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), ShapeFile)
			if err := tt.make(path); err != nil {
				t.Fatal(err)
			}
			_, err := ReadShape(path)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("ReadShape = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
