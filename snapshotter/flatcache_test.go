package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

func TestEvictionSkipsPinnedOldestFirst(t *testing.T) {
	const pages = 48 // 32 non-zero pages: 128 KiB allocated per flat file
	ctx := context.Background()
	fixtures := t.TempDir()
	root := t.TempDir()

	// Each step stages a fresh chain and keeps or drops its clone.
	steps := []struct {
		chain string
		keep  bool
	}{
		{"a", true},  // oldest, but pinned: must survive
		{"b", false}, // the oldest unpinned: evicted
		{"c", false}, // unpinned but newer: kept, the budget is met without it
		{"d", true},  // newest: over budget now
	}
	fxs := map[string]fixture{}
	for i, s := range steps {
		fxs[s.chain] = makeChain(t, filepath.Join(fixtures, s.chain), 10+i, pages, 1)
	}
	one := allocatedOf(t, fxs["a"].mem)
	// Room for three and a half files: staging the fourth must evict one.
	sn := newSnapshotter(t, root, WithFlatCacheSize(3*one+one/2))

	for _, s := range steps {
		top := importChain(t, sn, fxs[s.chain], s.chain)
		if _, err := sn.Prepare(ctx, "ctr-"+s.chain, top); err != nil {
			t.Fatal(err)
		}
		if !s.keep {
			if err := sn.Remove(ctx, "ctr-"+s.chain); err != nil {
				t.Fatal(err)
			}
		}
	}

	sn.flat.evictNow()
	var want []string
	for _, c := range []string{"a", "c", "d"} {
		want = append(want, filepath.Base(flatPath(t, root, fxs[c].dirs[0])))
	}
	slices.Sort(want)
	if got := flatFiles(t, root); !slices.Equal(got, want) {
		t.Errorf("flat cache holds %v, want a, c and d %v (b evicted)", got, want)
	}
}

func TestEvictionOrderIsLeastRecentlyUsed(t *testing.T) {
	const pages = 48
	ctx := context.Background()
	fixtures := t.TempDir()
	root := t.TempDir()
	var fxs []fixture
	for i := range 3 {
		fxs = append(fxs, makeChain(t, filepath.Join(fixtures, fmt.Sprint(i)), 20+i, pages, 1))
	}
	one := allocatedOf(t, fxs[0].mem)
	sn := newSnapshotter(t, root, WithFlatCacheSize(2*one+one/2))
	tops := make([]string, 3)
	stage := func(i int) {
		t.Helper()
		key := fmt.Sprintf("ctr-%d", i)
		if _, err := sn.Prepare(ctx, key, tops[i]); err != nil {
			t.Fatal(err)
		}
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		tops[i] = importChain(t, sn, fxs[i], fmt.Sprint("chain", i))
		stage(i)
	}
	stage(0) // 0 is now more recently used than 1
	tops[2] = importChain(t, sn, fxs[2], "chain2")
	stage(2)
	sn.flat.evictNow()

	if _, err := os.Stat(flatPath(t, root, fxs[1].dirs[0])); !os.IsNotExist(err) {
		t.Errorf("least recently used flat file survived (err %v)", err)
	}
	for _, i := range []int{0, 2} {
		if _, err := os.Stat(flatPath(t, root, fxs[i].dirs[0])); err != nil {
			t.Errorf("recently used flat file %d was evicted: %v", i, err)
		}
	}
}

func TestPrepareDoesNotWaitForEviction(t *testing.T) {
	const pages = 48
	ctx := context.Background()
	fixtures := t.TempDir()
	root := t.TempDir()
	old := makeChain(t, filepath.Join(fixtures, "old"), 25, pages, 1)
	fresh := makeChain(t, filepath.Join(fixtures, "new"), 26, pages, 1)
	one := allocatedOf(t, old.mem)
	entered := make(chan string, 1)
	release := make(chan struct{})
	// Unlinking a flat file blocks until the test releases it.
	slowRemove := withRemove(func(path string) error {
		entered <- path
		<-release
		return os.Remove(path)
	})
	sn := newSnapshotter(t, root, WithFlatCacheSize(one+one/2), slowRemove)
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before Close, which waits for the eviction pass

	oldTop := importChain(t, sn, old, "old")
	if _, err := sn.Prepare(ctx, "ctr-old", oldTop); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, "ctr-old"); err != nil {
		t.Fatal(err)
	}
	freshTop := importChain(t, sn, fresh, "new")
	prepared := make(chan error, 1)
	go func() {
		_, err := sn.Prepare(ctx, "ctr-new", freshTop)
		prepared <- err
	}()
	select {
	case err := <-prepared:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Prepare did not return while evicting a file was blocked: eviction runs on the Prepare path")
	}
	if got, want := <-entered, flatPath(t, root, old.dirs[0]); got != want {
		t.Errorf("evicting %s, want the unpinned older file %s", got, want)
	}
	unblock()
	sn.flat.evictNow()
	if got, want := flatFiles(t, root), []string{filepath.Base(flatPath(t, root, fresh.dirs[0]))}; !slices.Equal(got, want) {
		t.Errorf("flat cache holds %v after eviction, want only the new chain's %v", got, want)
	}
}

func TestRemoveDoesNotWaitForUnlink(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 28, 48, 1)
	root := t.TempDir()
	entered := make(chan string, 1)
	release := make(chan struct{})
	sn := newSnapshotter(t, root, withRemove(func(path string) error {
		entered <- path
		<-release
		return os.Remove(path)
	}))
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before Close, which waits for the eviction pass

	top := importChain(t, sn, fx, "layer")
	if _, err := sn.Prepare(ctx, "ctr", top); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, "ctr"); err != nil {
		t.Fatal(err)
	}
	removed := make(chan error, 1)
	go func() { removed <- sn.Remove(ctx, top) }()
	select {
	case err := <-removed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Remove of a link did not return while unlinking its flat file was blocked")
	}
	if got, want := <-entered, flatPath(t, root, fx.dirs[0]); got != want {
		t.Errorf("unlinking %s, want the removed link's flat file %s", got, want)
	}
	unblock()
	sn.flat.evictNow()
	if files := flatFiles(t, root); len(files) != 0 {
		t.Errorf("flat cache holds %v after its only link was removed, want it empty", files)
	}
}

func TestRestartDropsOrphanFlatFiles(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 29, 48, 1)
	root := t.TempDir()
	sn := newSnapshotter(t, root)
	top := importChain(t, sn, fx, "layer")
	if _, err := sn.Prepare(ctx, "ctr", top); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, "ctr"); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	// What a restart between a link's Remove and the eviction pass leaves.
	orphan := filepath.Join(root, "flat", "0123456789abcdef")
	if err := os.WriteFile(orphan, []byte("memory of a removed link"), 0o444); err != nil {
		t.Fatal(err)
	}

	sn = newSnapshotter(t, root)
	sn.flat.evictNow()
	if got, want := flatFiles(t, root), []string{filepath.Base(flatPath(t, root, fx.dirs[0]))}; !slices.Equal(got, want) {
		t.Errorf("flat cache holds %v after a restart, want only the live chain's %v", got, want)
	}
}

func TestCloseStopsEviction(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 27, 48, 1)
	root := t.TempDir()
	sn, err := New(context.Background(), root, WithFlatCacheSize(1))
	if err != nil {
		t.Fatal(err)
	}
	removableAfter(t, root)
	top := importChain(t, sn, fx, "layer")
	if _, err := sn.Prepare(ctx, "ctr", top); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, "ctr"); err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sn.flat.evictor.done:
	default:
		t.Fatal("Close returned with the eviction goroutine still running")
	}
}

func TestFlatFilesAreReadOnly(t *testing.T) {
	fx := makeChain(t, t.TempDir(), 30, 16, 1)
	root := t.TempDir()
	sn := newSnapshotter(t, root)
	top := importChain(t, sn, fx, "layer")
	if _, err := sn.Prepare(context.Background(), "ctr", top); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(flatPath(t, root, fx.dirs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 {
		t.Errorf("flat file mode %v, want 0444", fi.Mode().Perm())
	}
}

func TestStagingAcrossFilesystems(t *testing.T) {
	testenv.RequireRoot(t)
	const pages = 300
	fx := makeChain(t, t.TempDir(), 40, pages, 2)
	root := t.TempDir()
	// The snapshot dirs on their own tmpfs: link(2) from the flat cache fails with EXDEV.
	snaps := filepath.Join(root, "snapshots")
	if err := os.MkdirAll(snaps, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", snaps, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(snaps, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", snaps, err)
		}
	})
	sn := newSnapshotter(t, root)
	top := importChain(t, sn, fx, "layer")
	ms, err := sn.Prepare(context.Background(), "ctr", top)
	if err != nil {
		t.Fatalf("prepare across filesystems: %v", err)
	}
	staged := filepath.Join(mountDir(t, ms), chain.StagedMemory)
	flat := flatPath(t, root, fx.dirs[1])

	sameContent(t, staged, fx.mem)
	st, ft := stat(t, staged), stat(t, flat)
	if st.Dev == ft.Dev {
		t.Fatalf("staged memory and flat file share device %d: the test did not cross filesystems", st.Dev)
	}
	if ft.Nlink != 1 {
		t.Errorf("flat file nlink = %d after a copy, want 1 (a copy must not pin)", ft.Nlink)
	}
	if st.Size != int64(pages)*page {
		t.Errorf("staged size %d, want %d", st.Size, int64(pages)*page)
	}
	if got, want := st.Blocks*512, allocatedOf(t, fx.mem); got != want {
		t.Errorf("staged copy allocates %d bytes, want %d like the sparse source (holes kept)", got, want)
	}
}

func allocatedOf(t testing.TB, path string) int64 {
	t.Helper()
	return stat(t, path).Blocks * 512
}

// TestRemoveTopWhileStaging removes the top of a chain (issue 13, row 9)
// while a container Prepare builds its flat file: the Prepare fails, and
// the file it built must not outlive the chain.
func TestRemoveTopWhileStaging(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ordinary bool
	}{{"flat memory", false}, {"rootfs image", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ordinary {
				requireOrdinary(t)
			}
			ctx := context.Background()
			root := t.TempDir()
			built, release := make(chan struct{}), make(chan struct{})
			// Each hook builds for real, then waits for the test.
			hook := withFlatten(func(ctx context.Context, dirs []string, out string) error {
				defer func() { close(built); <-release }()
				return chain.Flatten(ctx, dirs, out)
			})
			if tc.ordinary {
				b := imageBuilder{mntDir: filepath.Join(root, "mnt"), layerDir: filepath.Join(root, "snapshots"), options: overlayOptions(root)}
				hook = withBuildImage(func(ctx context.Context, layers []string, out string) error {
					defer func() { close(built); <-release }()
					return b.build(ctx, layers, out)
				})
			}
			local := newSnapshotter(t, root, hook)
			sn := serve(t, local)
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			t.Cleanup(unblock) // before the snapshotter closes, on failure too
			var top string
			if tc.ordinary {
				top = importLayers(t, sn, testLayers(t), "layer")
			} else {
				top = importChain(t, sn, makeChain(t, t.TempDir(), 53, 64, 2), "layer")
			}

			errc := make(chan error, 1)
			go func() {
				_, err := sn.Prepare(ctx, "ctr", top)
				errc <- err
			}()
			select {
			case <-built:
			case err := <-errc:
				t.Fatalf("prepare ended before building: %v", err)
			}
			if err := sn.Remove(ctx, top); err != nil {
				t.Fatalf("remove the top while a prepare stages it: %v", err)
			}
			unblock()
			// It fails reading the removed link's state file, or creating
			// the snapshot on a parent that is gone.
			if err := <-errc; err == nil {
				t.Fatal("prepare on a parent removed meanwhile succeeded")
			}
			local.flat.evictNow()
			if files := flatFiles(t, root); len(files) != 0 {
				t.Errorf("flat files %v outlive the removed chain, want none", files)
			}
		})
	}
}
