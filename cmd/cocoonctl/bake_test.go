package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/qemu"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestBakeRejectsBadFlags(t *testing.T) {
	guest := t.TempDir()
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz"} {
		if err := os.WriteFile(filepath.Join(guest, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	existing := t.TempDir()
	ok := bakeOptions{guest: guest, memory: "512M", vcpus: 1, out: filepath.Join(t.TempDir(), "link"), config: "/dev/null"}
	tests := []struct {
		name   string
		modify func(*bakeOptions)
		want   string
	}{
		{"no out", func(o *bakeOptions) { o.out = "" }, "--out is required"},
		{"out exists", func(o *bakeOptions) { o.out = existing }, "already exists"},
		{"archive without image", func(o *bakeOptions) { o.archive = "x.tar" }, "--image and --archive"},
		{"image without archive", func(o *bakeOptions) { o.image = "x:1" }, "--image and --archive"},
		{"no vcpus", func(o *bakeOptions) { o.vcpus = 0 }, "--vcpus 0"},
		{"negative disk slots", func(o *bakeOptions) { o.diskSlots = -1 }, "--disk-slots -1: want 0 to 16"},
		{"too many disk slots", func(o *bakeOptions) { o.diskSlots = 17 }, "--disk-slots 17: want 0 to 16"},
		{"bad memory", func(o *bakeOptions) { o.memory = "lots" }, `--memory "lots"`},
		{"tiny memory", func(o *bakeOptions) { o.memory = "1M" }, `--memory "1M"`},
		{"no guest", func(o *bakeOptions) { o.guest = t.TempDir() }, "make guest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.modify(&o)
			err := bake(context.Background(), io.Discard, io.Discard, o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to contain %q", err, tt.want)
			}
		})
	}
	if _, err := ok.resolve(); err != nil {
		t.Fatalf("valid options rejected: %v", err)
	}
	slots := ok
	slots.diskSlots = 8
	if spec, err := slots.resolve(); err != nil || spec.boot.DiskSlots != 8 {
		t.Fatalf("--disk-slots 8 resolved to %+v, %v; want 8 slots", spec.boot, err)
	}
}

// TestBake bakes the guest with a warm-up command, packs it, and restores
// the link to check the warm-up's effect was captured.
func TestBake(t *testing.T) {
	testenv.QEMU(t)
	guest := testenv.Guest(t)
	root := t.TempDir()
	o := bakeOptions{
		guest: guest, memory: "256M", vcpus: 1, cmdline: defaultCmdline, timeout: 3 * time.Minute,
		run: "echo warmed > /run/warm", out: filepath.Join(root, "link"), runDir: filepath.Join(root, "run"),
		image: "example.com/cocoon/test:1", archive: filepath.Join(root, "image.tar"), config: "/dev/null",
	}
	var out bytes.Buffer
	if err := bake(context.Background(), &out, io.Discard, o); err != nil {
		t.Fatalf("bake: %v\n%s", err, out.String())
	}
	for _, phase := range []string{"boot", "agent", "run", "snapshot", "pack", "total"} {
		if !strings.Contains(out.String(), "bake: "+phase) {
			t.Errorf("output lacks the %s phase:\n%s", phase, out.String())
		}
	}
	link, err := chain.Validate(o.out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if link.Hypervisor != "qemu" || link.MemoryBytes != 256<<20 || link.Kind != chain.KindFull {
		t.Fatalf("link %+v", link)
	}
	// Every baked snapshot has a NIC and a rootfs slot, their backends
	// chosen at restore.
	shape, err := qemu.ReadShape(filepath.Join(o.out, qemu.ShapeFile))
	if err != nil {
		t.Fatal(err)
	}
	if shape.Version != 2 || !slices.Contains(shape.Devices, "virtio-net-device:net0") || !slices.Contains(shape.Devices, "virtio-blk-device:rootfs") {
		t.Errorf("qemu.json version %d, devices %v: want version 2 with the NIC and the rootfs slot", shape.Version, shape.Devices)
	}
	if st, err := os.Stat(o.archive); err != nil || st.Size() == 0 {
		t.Fatalf("archive: %v", err)
	}
	if entries, _ := os.ReadDir(o.runDir); len(entries) != 0 {
		t.Fatalf("bake left %d entries in its run dir", len(entries))
	}
	if got := restoreAndRead(t, root, o.out, "/run/warm"); got != "warmed\n" {
		t.Fatalf("restored guest has %q in /run/warm, want the warm-up's output", got)
	}
}

// A failing warm-up command fails the bake and leaves nothing behind.
func TestBakeWarmUpFails(t *testing.T) {
	testenv.QEMU(t)
	root := t.TempDir()
	o := bakeOptions{
		guest: testenv.Guest(t), memory: "256M", vcpus: 1, cmdline: defaultCmdline, timeout: 3 * time.Minute,
		run: "echo failing >&2; exit 3", out: filepath.Join(root, "link"), runDir: filepath.Join(root, "run"), config: "/dev/null",
	}
	var errOut bytes.Buffer
	err := bake(context.Background(), io.Discard, &errOut, o)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("bake err %v, want the warm-up's exit status 3", err)
	}
	if !strings.Contains(errOut.String(), "failing") {
		t.Errorf("the warm-up's stderr %q was not passed on", errOut.String())
	}
	if _, err := os.Stat(o.out); !os.IsNotExist(err) {
		t.Errorf("a failed bake left %s (%v)", o.out, err)
	}
	if entries, _ := os.ReadDir(o.runDir); len(entries) != 0 {
		t.Errorf("a failed bake left %d entries in its run dir", len(entries))
	}
}

// restoreAndRead stages link the way the snapshotter does, restores it with
// mmap and reads path in the guest.
func restoreAndRead(t *testing.T, root, link, path string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	staged := filepath.Join(root, "staged")
	if err := os.Mkdir(staged, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := chain.Flatten(ctx, []string{link}, filepath.Join(staged, chain.StagedMemory)); err != nil {
		t.Fatal(err)
	}
	l, err := chain.ReadLink(link)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range l.StateFiles {
		b, err := os.ReadFile(filepath.Join(link, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(staged, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := chain.WriteStaged(staged, []*chain.Link{l}); err != nil {
		t.Fatal(err)
	}
	vm, err := qemu.New(config.Default().QEMU).Restore(ctx, hypervisor.RestoreRequest{
		StagedDir: staged, RunDir: filepath.Join(root, "restored"), Mode: hypervisor.ModeMmap,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := agent.WaitReady(ctx, vm.DialAgent)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	proc, err := c.Exec(ctx, agent.ExecRequest{ID: "cat", Args: []string{"cat", path}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	_, stdout, _ := proc.Stdio()
	b, _ := io.ReadAll(stdout)
	if st, err := c.Wait(ctx, "cat"); err != nil || st.Code != 0 {
		t.Fatalf("cat %s: %+v %v", path, st, err)
	}
	return string(b)
}
