package qemu

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// The guest is baked once per test binary; tests restore it as they like.
var baked struct {
	once sync.Once
	dir  string
	link string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{baked.dir, bakedWithSlots.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// bootGuest cold-boots the project's guest and waits for its agent.
func bootGuest(t testing.TB, d *Driver, runDir string) (*VM, *agent.Client) {
	t.Helper()
	guest := testenv.Guest(t)
	ctx := testContext(t, 2*time.Minute)
	v, err := d.Boot(ctx, BootSpec{
		Kernel: filepath.Join(guest, "vmlinuz"), Initrd: filepath.Join(guest, "initramfs.cpio.gz"),
		Cmdline: "console=ttyS0 panic=-1 quiet", MemoryBytes: testMemory, VCPUs: 1, RunDir: runDir,
	})
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	closeVM(t, v)
	c, err := agent.WaitReady(ctx, v.DialAgent)
	if err != nil {
		t.Fatalf("wait for agent: %v (console %s)", err, readSerial(v))
	}
	return v, c
}

func readSerial(v *VM) string {
	b, _ := os.ReadFile(v.SerialLog())
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return string(b)
}

// bakedLink returns a full link of the booted guest with its agent idle.
func bakedLink(t testing.TB, d *Driver) string {
	t.Helper()
	testenv.Guest(t)
	baked.once.Do(func() {
		if baked.dir, baked.err = os.MkdirTemp("", "qemu-baked-"); baked.err != nil {
			return
		}
		baked.link, baked.err = bake(d, baked.dir)
	})
	if baked.err != nil {
		t.Fatalf("bake: %v", baked.err)
	}
	return baked.link
}

func bake(d *Driver, dir string) (string, error) {
	return bakeGuest(d, dir, testMemory, 0)
}

// bakeGuest boots the guest with mem bytes of RAM and slots spare disk
// slots, and snapshots it into dir/link once its agent answers.
func bakeGuest(d *Driver, dir string, mem int64, slots int) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	guest := testenv.RepoRoot() + "/build/guest"
	if g := os.Getenv("COCOON_GUEST_DIR"); g != "" {
		guest = g
	}
	v, err := d.Boot(ctx, BootSpec{
		Kernel: filepath.Join(guest, "vmlinuz"), Initrd: filepath.Join(guest, "initramfs.cpio.gz"),
		Cmdline: "console=ttyS0 panic=-1 quiet", MemoryBytes: mem, VCPUs: 1, DiskSlots: slots,
		RunDir: filepath.Join(dir, "boot"),
	})
	if err != nil {
		return "", err
	}
	defer v.Close()
	c, err := agent.WaitReady(ctx, v.DialAgent)
	if err != nil {
		return "", fmt.Errorf("wait for agent: %w", err)
	}
	c.Close()
	link := filepath.Join(dir, "link")
	return link, v.Snapshot(ctx, link, hypervisor.SnapshotFull)
}

// restoreReady restores staged in mode, resumes it and waits for its agent.
func restoreReady(t testing.TB, d *Driver, req hypervisor.RestoreRequest) (*VM, *agent.Client) {
	t.Helper()
	ctx := testContext(t, time.Minute)
	hv, err := d.Restore(ctx, req)
	if err != nil {
		t.Fatalf("restore %s: %v", req.Mode, err)
	}
	v := hv.(*VM)
	closeVM(t, v)
	if err := v.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	c, err := agent.WaitReady(ctx, v.DialAgent)
	if err != nil {
		t.Fatalf("agent after %s restore: %v (console %s)", req.Mode, err, readSerial(v))
	}
	t.Cleanup(func() { c.Close() })
	return v, c
}

// run execs args in the guest and returns its stdout; a non-zero exit fails t.
func run(t testing.TB, c *agent.Client, args ...string) string {
	t.Helper()
	ctx := testContext(t, 30*time.Second)
	id := fmt.Sprintf("test-%d", time.Now().UnixNano())
	proc, err := c.Exec(ctx, agent.ExecRequest{ID: id, Args: args, Cwd: "/"})
	if err != nil {
		t.Fatalf("exec %q: %v", args, err)
	}
	_, stdout, stderr := proc.Stdio()
	var out, errOut bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errOut, stderr); close(done) }()
	io.Copy(&out, stdout)
	<-done
	st, err := c.Wait(ctx, id)
	if err != nil || st.Code != 0 {
		t.Fatalf("%q: status %+v, %v; stderr %s", args, st, err, errOut.String())
	}
	return strings.TrimSpace(out.String())
}

func TestBootAgentPing(t *testing.T) {
	d := newTestDriver(t)
	_, c := bootGuest(t, d, filepath.Join(t.TempDir(), "run"))
	if err := c.Ping(testContext(t, 10*time.Second)); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if got := run(t, c, "/bin/sh", "-c", "cat /sys/class/virtio-ports/*/name"); got != agentPort {
		t.Fatalf("virtio port name %q, want %q", got, agentPort)
	}
}
