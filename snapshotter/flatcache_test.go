package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

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

	if _, err := os.Stat(flatPath(t, root, fxs[1].dirs[0])); !os.IsNotExist(err) {
		t.Errorf("least recently used flat file survived (err %v)", err)
	}
	for _, i := range []int{0, 2} {
		if _, err := os.Stat(flatPath(t, root, fxs[i].dirs[0])); err != nil {
			t.Errorf("recently used flat file %d was evicted: %v", i, err)
		}
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
