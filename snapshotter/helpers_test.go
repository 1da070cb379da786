package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

const page = 4096

// withFlatten replaces chain.Flatten, e.g. to count calls.
func withFlatten(f flattenFunc) Opt {
	return func(c *config) { c.flatten = f }
}

// withBuildImage replaces the rootfs image builder, e.g. to count builds.
func withBuildImage(f imageFunc) Opt {
	return func(c *config) { c.buildImage = f }
}

// withRemove replaces os.Remove for unlinking flat files, e.g. to block it.
func withRemove(f removeFunc) Opt {
	return func(c *config) { c.remove = f }
}

// withBootID replaces reading the kernel's boot ID.
func withBootID(id func() (string, error)) Opt {
	return func(c *config) { c.bootID = id }
}

// countFlattens returns an Opt that counts chain.Flatten calls in n.
func countFlattens(n *atomic.Int64) Opt {
	return withFlatten(func(ctx context.Context, dirs []string, out string) error {
		n.Add(1)
		return chain.Flatten(ctx, dirs, out)
	})
}

// fixture is a chain of link dirs and the memory its flattening must equal.
type fixture struct {
	dirs []string // oldest first
	mem  string   // the top link's memory image
}

// pageByte is the fill of page p of memory version v; 0 leaves a hole.
func pageByte(seed, v, p int) byte {
	if (p+seed)%3 == 0 {
		return 0
	}
	return byte(1 + (seed*31+v*7+p)%251)
}

// writeMemory writes a sparse memory image of pages pages, version v.
func writeMemory(t testing.TB, path string, seed, v, pages int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(pages) * page); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, page)
	for p := 0; p < pages; p++ {
		b := pageByte(seed, v, p)
		if v > 0 && p%5 != 0 {
			b = pageByte(seed, 0, p) // a diff changes every 5th page only
		}
		if b == 0 {
			continue
		}
		for i := range buf {
			buf[i] = b
		}
		buf[0] = byte(p) // pages differ from one another
		if _, err := f.WriteAt(buf, int64(p)*page); err != nil {
			t.Fatal(err)
		}
	}
}

func testMeta() chain.Meta {
	return chain.Meta{Hypervisor: "qemu", HypervisorBuild: "QEMU emulator version 7.2.0", GuestOS: "linux", VCPUs: 1, StateFiles: []string{"qemu.state"}}
}

// makeChain writes links links (a full one, then diffs of every 5th page)
// of a pages-page memory under dir.
func makeChain(t testing.TB, dir string, seed, pages, links int) fixture {
	t.Helper()
	ctx := context.Background()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var fx fixture
	for v := 0; v < links; v++ {
		mem := filepath.Join(dir, fmt.Sprintf("mem%d", v))
		out := filepath.Join(dir, fmt.Sprintf("link%d", v))
		writeMemory(t, mem, seed, v, pages)
		if err := os.MkdirAll(out, 0o755); err != nil {
			t.Fatal(err)
		}
		state := fmt.Sprintf("state of seed %d version %d", seed, v)
		if err := os.WriteFile(filepath.Join(out, "qemu.state"), []byte(state), 0o644); err != nil {
			t.Fatal(err)
		}
		var err error
		if v == 0 {
			_, err = chain.WriteFull(ctx, mem, testMeta(), out)
		} else {
			var dirty []chain.Extent
			for p := 0; p < pages; p += 5 {
				dirty = append(dirty, chain.Extent{Offset: int64(p) * page, Length: page})
			}
			_, err = chain.WriteDiffPages(ctx, mem, dirty, fx.dirs[v-1], testMeta(), out)
		}
		if err != nil {
			t.Fatalf("write link %d: %v", v, err)
		}
		fx.dirs = append(fx.dirs, out)
		fx.mem = mem
	}
	return fx
}

func newSnapshotter(t testing.TB, root string, opts ...Opt) *Snapshotter {
	t.Helper()
	sn, err := New(context.Background(), root, opts...)
	if err != nil {
		t.Fatalf("new snapshotter: %v", err)
	}
	t.Cleanup(func() { sn.Close() })
	removableAfter(t, root)
	return sn
}

// removableAfter makes root's committed links, read-only dirs that only
// root may empty, writable again when t ends, so that t.TempDir can
// remove them without root too.
func removableAfter(t testing.TB, root string) {
	t.Cleanup(func() { setWritable(root, true) })
}

// removeFromLink removes path, a file of a committed link, as an attacker
// or a broken disk would.
func removeFromLink(t testing.TB, path string) {
	t.Helper()
	dir := filepath.Dir(path)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// importChain unpacks fx's links as containerd would (Prepare with the ref
// label, write into the mount, Commit) and returns the top's name.
func importChain(t testing.TB, sn snapshots.Snapshotter, fx fixture, prefix string) string {
	t.Helper()
	ctx := context.Background()
	parent := ""
	for i, dir := range fx.dirs {
		name := fmt.Sprintf("%s-%d", prefix, i)
		key := "extract-" + name
		ms, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: name}))
		if err != nil {
			t.Fatalf("prepare %s: %v", key, err)
		}
		copyDir(t, dir, mountDir(t, ms))
		if err := sn.Commit(ctx, name, key); err != nil {
			t.Fatalf("commit %s: %v", key, err)
		}
		parent = name
	}
	return parent
}

// mountDir returns the source of the single bind mount ms.
func mountDir(t testing.TB, ms []mount.Mount) string {
	t.Helper()
	if len(ms) != 1 || ms[0].Type != "bind" {
		t.Fatalf("mounts = %+v, want one bind mount", ms)
	}
	return ms[0].Source
}

func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	des, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		data, err := os.ReadFile(filepath.Join(src, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, de.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sameContent fails t unless files a and b hold the same bytes.
func sameContent(t testing.TB, a, b string) {
	t.Helper()
	if n := testenv.DifferingPages(t, a, b); n != 0 {
		t.Fatalf("%s and %s differ in %d pages", a, b, n)
	}
}

func stat(t testing.TB, path string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// flatFiles lists the names in root/flat.
func flatFiles(t testing.TB, root string) []string {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(root, "flat"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func flatPath(t testing.TB, root string, top string) string {
	t.Helper()
	l, err := chain.ReadLink(top)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "flat", l.ID().Encoded())
}

// prepareAll prepares n containers ("ctr-0" …) on parent at once and
// returns their mounts in order.
func prepareAll(t testing.TB, sn snapshots.Snapshotter, parent string, n int) [][]mount.Mount {
	t.Helper()
	mounts := make([][]mount.Mount, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			mounts[i], errs[i] = sn.Prepare(context.Background(), fmt.Sprintf("ctr-%d", i), parent)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	return mounts
}
