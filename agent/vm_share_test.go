package agent_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/internal/vmtest"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/share"
)

// TestMain runs the test binary as a share's helper when share.Serve
// starts it so.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == share.Argv0 {
		share.Main()
		return
	}
	os.Exit(m.Run())
}

// testShare shares a host directory with the real guest: what the guest
// writes is on the host at once, what the host writes shows in the guest,
// and closing the share unmounts it.
func testShare(t *testing.T, tg *target) {
	const guest = "/run/cocoon/binds/.pod/share-test"
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "from-host"), []byte("h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	sh, err := tg.c.OpenShare(ctx, guest, false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := share.Serve(ctx, sh, host, share.ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	sh1 := func(script string) result {
		t.Helper()
		n++
		return run(t, tg.c, agent.ExecRequest{ID: fmt.Sprintf("%s-%d", procID(t), n), Args: []string{"sh", "-c", script}}, "")
	}
	start := time.Now()
	res := sh1("cd " + guest + " && cat from-host && mkdir -p d/e && echo g > d/e/f && mv d/e/f d/g && " +
		"dd if=/dev/zero of=big bs=64k count=64 2>/dev/null && ls")
	t.Logf("guest's script on the share: %s", time.Since(start))
	if res.status.Code != 0 || res.stdout != "h\nbig\nd\nfrom-host\n" {
		t.Fatalf("guest on the share: %q %q exit %+v", res.stdout, res.stderr, res.status)
	}
	if b, err := os.ReadFile(filepath.Join(host, "d", "g")); err != nil || string(b) != "g\n" {
		t.Errorf("the guest's file on the host: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(host, "big")); err != nil || fi.Size() != 4<<20 {
		t.Errorf("the guest's 4 MiB file on the host: %v, %v", fi, err)
	}
	if err := os.WriteFile(filepath.Join(host, "later"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := sh1("cat " + guest + "/later"); res.stdout != "2\n" {
		t.Errorf("the host's new file in the guest: %q %q", res.stdout, res.stderr)
	}
	cctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := srv.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if res := sh1("grep -c " + guest + " /proc/mounts; test -e " + guest); res.stdout != "0\n" || res.status.Code == 0 {
		t.Errorf("after close, the share is mounted or its directory left: %q %+v", res.stdout, res.status)
	}
}

// BenchmarkVMShare measures a shared directory in the real guest against
// the guest's own tmpfs, each op one exec of busybox in the guest: open
// (the share mounted, its helper started, and a file found there), a
// 4 MiB write (dd, 64 KiB blocks) and a listing of 100 files with their
// attributes (ls -l). An exec alone is ls-100-tmpfs's order.
func BenchmarkVMShare(b *testing.B) {
	vm := vmtest.Boot(b)
	c := vm.Client(b)
	ctx := context.Background()
	host := b.TempDir()
	for i := range 100 {
		if err := os.WriteFile(filepath.Join(host, fmt.Sprint("f", i)), []byte("x"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	b.Run("open", func(b *testing.B) {
		for b.Loop() {
			n++
			sh, err := c.OpenShare(ctx, fmt.Sprint("/run/cocoon/binds/bench-open-", n), false)
			if err != nil {
				b.Fatal(err)
			}
			srv, err := share.Serve(ctx, sh, host, share.ReadWrite)
			if err != nil {
				b.Fatal(err)
			}
			benchSh(b, c, "test -e "+sh.Path+"/f0")
			b.StopTimer()
			if err := srv.Close(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	sh, err := c.OpenShare(ctx, "/run/cocoon/binds/bench", false)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := share.Serve(ctx, sh, host, share.ReadWrite)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Close(ctx) })
	benchSh(b, c, "mkdir -p /tmp/bench && cp /run/cocoon/binds/bench/f* /tmp/bench/")
	for _, dir := range []string{"/run/cocoon/binds/bench", "/tmp/bench"} {
		name := map[bool]string{true: "share", false: "tmpfs"}[dir != "/tmp/bench"]
		b.Run("write-4MiB-"+name, func(b *testing.B) {
			for b.Loop() {
				benchSh(b, c, "dd if=/dev/zero of="+dir+"/big bs=64k count=64 2>/dev/null")
			}
		})
		b.Run("ls-100-"+name, func(b *testing.B) {
			for b.Loop() {
				benchSh(b, c, "ls -l "+dir+" >/dev/null")
			}
		})
	}
}

// benchSh runs script in the guest and fails unless it exits 0.
func benchSh(b *testing.B, c *agent.Client, script string) {
	ctx := context.Background()
	p, err := c.Exec(ctx, agent.ExecRequest{ID: fmt.Sprint("bench-", time.Now().UnixNano()), Args: []string{"sh", "-c", script}})
	if err != nil {
		b.Fatal(err)
	}
	_, out, _ := p.Stdio()
	_, _ = io.Copy(io.Discard, out)
	st, err := c.Wait(ctx, p.ID)
	if err != nil || st.Code != 0 {
		b.Fatalf("%s: exit %+v, %v", script, st, err)
	}
}
