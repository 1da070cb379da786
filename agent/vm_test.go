package agent_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/internal/vmtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestVM boots the real guest on QEMU and runs every agent case against its
// agent over virtio-serial, then the guest-only ones.
func TestVM(t *testing.T) {
	vm := vmtest.Boot(t)
	tg := &target{c: vm.Client(t), dial: vm.Dial}
	t.Cleanup(func() { _ = tg.c.Close() })
	t.Run("KernelRelease", func(t *testing.T) { testKernelRelease(t, tg) })
	for _, tc := range agentCases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, tg) })
	}
	t.Run("Init", func(t *testing.T) { testGuestInit(t, tg) })
	t.Run("Share", func(t *testing.T) { testShare(t, tg) })
	t.Run("Shutdown", func(t *testing.T) {
		if err := tg.c.Shutdown(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-vm.Exited():
		case <-time.After(callTimeout):
			t.Error("the guest did not power off")
		}
	})
}

func testKernelRelease(t *testing.T, tg *target) {
	want := buildInfo(t)["kernel.release"]
	res := run(t, tg.c, agent.ExecRequest{ID: procID(t), Args: []string{"uname", "-r"}}, "")
	if res.stdout != want+"\n" || res.stderr != "" || res.status.Code != 0 {
		t.Errorf("uname -r: %q %q exit %+v, want %q exit 0", res.stdout, res.stderr, res.status, want)
	}
}

func buildInfo(t *testing.T) map[string]string {
	f, err := os.Open(filepath.Join(testenv.Guest(t), "BUILDINFO"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			info[k] = v
		}
	}
	return info
}

// testGuestInit: Init sets the guest's clock and name and writes its files.
func testGuestInit(t *testing.T, tg *target) {
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	files := []agent.File{{Path: "/etc/cocoon-test/hosts", Data: []byte("10.0.0.7 clone-7\n"), Mode: 0o640}}
	if _, err := tg.c.Init(ctxT(t), agent.InitRequest{Time: now, Entropy: entropy, Hostname: "clone-7", Files: files}); err != nil {
		t.Fatal(err)
	}
	res := run(t, tg.c, agent.ExecRequest{ID: procID(t), Args: []string{"sh", "-c", "hostname; date +%s; stat -c %a /etc/cocoon-test/hosts; cat /etc/cocoon-test/hosts"}}, "")
	lines := strings.Fields(res.stdout)
	if len(lines) != 5 || lines[0] != "clone-7" || lines[2] != "640" || lines[3] != "10.0.0.7" {
		t.Fatalf("hostname; date; the file: %q, want clone-7, a time, and the file Init wrote", res.stdout)
	}
	sec, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(time.Unix(sec, 0)); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("guest clock is %v off the host's", d)
	}
}

// BenchmarkVMColdBoot measures QEMU start to a ready agent.
func BenchmarkVMColdBoot(b *testing.B) {
	for b.Loop() {
		vm := vmtest.Boot(b)
		c := vm.Client(b)
		b.StopTimer()
		c.Close()
		vm.Stop()
		b.StartTimer()
	}
}

// BenchmarkVMInit measures Init in a booted guest with a NIC: the identity
// alone (all Init carried before files, network and rootfs), with the
// resolver files and the NIC taken down (a task without a network), and
// with the NIC configured (a task with one; needs virtio_net in the guest).
func BenchmarkVMInit(b *testing.B) {
	vm := vmtest.Start(b, vmtest.Options{NICMAC: snapshotMAC})
	c := vm.Client(b)
	ctx := context.Background()
	entropy := make([]byte, 64)
	files := []agent.File{
		{Path: "/etc/resolv.conf", Data: []byte("nameserver 10.88.0.1\n")},
		{Path: "/etc/hosts", Data: []byte("127.0.0.1 localhost\n10.88.0.4 clone\n")},
	}
	for _, bc := range []struct {
		name string
		req  agent.InitRequest
	}{
		{"identity", agent.InitRequest{Entropy: entropy, Hostname: "clone"}},
		{"files-nic-down", agent.InitRequest{Entropy: entropy, Hostname: "clone", Files: files}},
		{"network", agent.InitRequest{Entropy: entropy, Hostname: "clone", Files: files, Network: cloneNetwork()}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				bc.req.Time = time.Now()
				if _, err := c.Init(ctx, bc.req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVMPing measures an agent call's round trip into the guest.
func BenchmarkVMPing(b *testing.B) {
	vm := vmtest.Boot(b)
	c := vm.Client(b)
	ctx := context.Background()
	for b.Loop() {
		if err := c.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestVMSnapshotRestore snapshots a guest with a call in flight and restores
// it in a new QEMU: the in-flight call fails, a new host connection works,
// and the guest's process lived on through it.
func TestVMSnapshotRestore(t *testing.T) {
	dir := t.TempDir()
	mem, state := filepath.Join(dir, "memory"), filepath.Join(dir, "state")
	src := vmtest.Start(t, vmtest.Options{MemoryFile: mem, Share: true})
	c := src.Client(t)
	ctx := ctxT(t)
	if _, err := c.Exec(ctx, agent.ExecRequest{ID: "survivor", Args: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { _, err := c.Wait(ctx, "survivor"); waited <- err }()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	src.Snapshot(t, state)
	src.Stop()
	if err := <-waited; err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait in flight at the snapshot: %v, want a prompt connection error", err)
	}

	clone := vmtest.Start(t, vmtest.Options{MemoryFile: mem, Incoming: true})
	clone.Restore(t, state)
	c = clone.Client(t)
	res := run(t, c, agent.ExecRequest{ID: "after", Args: []string{"echo", "restored"}}, "")
	if res.stdout != "restored\n" || res.status.Code != 0 {
		t.Errorf("exec after restore: %q %+v", res.stdout, res.status)
	}
	if err := c.Signal(ctx, "survivor", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Wait(ctx, "survivor"); err != nil || st.Signal != int(syscall.SIGKILL) {
		t.Errorf("wait for the process started before the snapshot: %+v %v, want SIGKILL", st, err)
	}
}
