package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func TestConcurrentPreparesFlattenOnce(t *testing.T) {
	const clones = 16
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 1, 256, 2)
	root := t.TempDir()
	var flattens atomic.Int64
	sn := newSnapshotter(t, root, countFlattens(&flattens))
	top := importChain(t, sn, fx, "layer")

	var sources []string
	for _, ms := range prepareAll(t, sn, top, clones) {
		sources = append(sources, ms[0].Source)
	}
	if n := flattens.Load(); n != 1 {
		t.Fatalf("%d concurrent prepares flattened %d times, want 1", clones, n)
	}
	flat := flatPath(t, root, fx.dirs[1])
	want := stat(t, flat)
	if want.Nlink != clones+1 {
		t.Errorf("flat file nlink = %d, want %d", want.Nlink, clones+1)
	}
	for _, src := range sources {
		mem := filepath.Join(src, chain.StagedMemory)
		if st := stat(t, mem); st.Ino != want.Ino || st.Dev != want.Dev {
			t.Errorf("%s is inode %d, want the flat file's %d", mem, st.Ino, want.Ino)
		}
	}
	sameContent(t, filepath.Join(sources[0], chain.StagedMemory), fx.mem)

	for i := range clones {
		if err := sn.Remove(ctx, fmt.Sprintf("ctr-%d", i)); err != nil {
			t.Fatalf("remove: %v", err)
		}
	}
	if n := stat(t, flat).Nlink; n != 1 {
		t.Errorf("after removing every clone nlink = %d, want 1", n)
	}
	for _, src := range sources {
		if _, err := os.Stat(src); !os.IsNotExist(err) {
			t.Errorf("staging dir %s still exists after Remove (err %v)", src, err)
		}
	}
}

func TestStagedDir(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 2, 64, 2)
	sn := newSnapshotter(t, t.TempDir())
	top := importChain(t, sn, fx, "layer")

	for _, tc := range []struct {
		kind snapshots.Kind
		mode string
	}{
		{snapshots.KindActive, "rw"},
		{snapshots.KindView, "ro"},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			key := "staged-" + tc.kind.String()
			create := sn.Prepare
			if tc.kind == snapshots.KindView {
				create = sn.View
			}
			ms, err := create(ctx, key, top)
			if err != nil {
				t.Fatal(err)
			}
			if got := ms[0].Options; len(got) != 2 || got[1] != tc.mode {
				t.Errorf("mount options %v, want [rbind %s]", got, tc.mode)
			}
			again, err := sn.Mounts(ctx, key)
			if err != nil || again[0].Source != ms[0].Source {
				t.Fatalf("Mounts = %+v, %v; want %+v", again, err, ms)
			}
			st, err := chain.OpenStaged(ms[0].Source)
			if err != nil {
				t.Fatalf("open staged: %v", err)
			}
			if len(st.Links) != 2 || st.Top().Parent != st.Links[0].ID() {
				t.Errorf("staged chain has %d links, want the 2-link chain", len(st.Links))
			}
			state, err := os.ReadFile(st.StatePath("qemu.state"))
			if err != nil || string(state) != "state of seed 2 version 1" {
				t.Errorf("staged state file = %q, %v; want the top link's", state, err)
			}
			if err := os.WriteFile(st.StatePath("qemu.state"), []byte("patched"), 0o644); err != nil {
				t.Errorf("staged state file is not a private writable copy: %v", err)
			}
			orig, _ := os.ReadFile(filepath.Join(fx.dirs[1], "qemu.state"))
			if string(orig) != "state of seed 2 version 1" {
				t.Errorf("patching the staged state file changed the source link")
			}
			sameContent(t, st.MemoryPath(), fx.mem)
			if err := sn.Remove(ctx, key); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestMetadataCalls(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 3, 32, 2)
	sn := newSnapshotter(t, t.TempDir())
	top := importChain(t, sn, fx, "layer")
	if _, err := sn.Prepare(ctx, "ctr", top); err != nil {
		t.Fatal(err)
	}

	info, err := sn.Stat(ctx, top)
	if err != nil || info.Kind != snapshots.KindCommitted || info.Parent != "layer-0" {
		t.Fatalf("Stat(%s) = %+v, %v; want committed with parent layer-0", top, info, err)
	}
	info.Labels = map[string]string{"test": "yes"}
	if got, err := sn.Update(ctx, info, "labels.test"); err != nil || got.Labels["test"] != "yes" {
		t.Fatalf("Update = %+v, %v", got, err)
	}
	u, err := sn.Usage(ctx, "ctr")
	if err != nil || u.Size < 32*page/2 {
		t.Errorf("Usage(ctr) = %+v, %v; want at least the staged memory", u, err)
	}
	var names []string
	if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		names = append(names, i.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(names) != 3 {
		t.Errorf("Walk saw %v, want layer-0, layer-1 and ctr", names)
	}
	if err := sn.Remove(ctx, top); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("removing a link with a staged child: %v, want failed precondition", err)
	}
	if err := sn.Commit(ctx, "not-a-link", "ctr"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("committing a staged dir: %v, want invalid argument", err)
	}
	for _, key := range []string{"ctr", top} {
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatalf("remove %s: %v", key, err)
		}
	}
	sn.flat.evictNow()
	if files := flatFiles(t, sn.root); len(files) != 0 {
		t.Errorf("flat cache after removing the chain's top link: %v, want empty", files)
	}
}

func TestStartupReconciles(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 4, 16, 1)
	root := t.TempDir()
	sn, err := New(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	removableAfter(t, root)
	top := importChain(t, sn, fx, "layer")
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatal(err)
	}
	sn.Close()

	leftovers := []string{
		filepath.Join(root, "snapshots", "9999"),
		filepath.Join(root, "snapshots", tempDirPrefix+"123"),
		filepath.Join(root, "snapshots", removedDirPrefix+"7"),
	}
	for _, d := range leftovers {
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tmpFlat := filepath.Join(root, "flat", ".tmp-half-written")
	if err := os.WriteFile(tmpFlat, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}

	sn = newSnapshotter(t, root)
	for _, p := range append(leftovers, tmpFlat) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived a restart (err %v)", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ms[0].Source, chain.StagedMemory)); err != nil {
		t.Errorf("a live staged dir was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mustMounts(t, sn, "ctr"), chain.StagedMemory)); err != nil {
		t.Errorf("staged snapshot unusable after restart: %v", err)
	}
}

func mustMounts(t *testing.T, sn *Snapshotter, key string) string {
	t.Helper()
	ms, err := sn.Mounts(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return mountDir(t, ms)
}

func TestCleanupKeepsInFlightDirs(t *testing.T) {
	root := t.TempDir()
	sn := newSnapshotter(t, root)
	inFlight := filepath.Join(root, "snapshots", tempDirPrefix+"1")
	orphans := []string{filepath.Join(root, "snapshots", "42"), filepath.Join(root, "snapshots", removedDirPrefix+"3")}
	for _, d := range append(orphans, inFlight) {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := sn.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range orphans {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("orphan %s survived Cleanup (err %v)", d, err)
		}
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("Cleanup removed a dir a Prepare may still be filling: %v", err)
	}
}

func TestFailedPrepareLeavesNothing(t *testing.T) {
	ctx := context.Background()
	fixtures := t.TempDir()
	root := t.TempDir()
	var flattens atomic.Int64
	sn := newSnapshotter(t, root, countFlattens(&flattens))
	staged := makeChain(t, filepath.Join(fixtures, "staged"), 90, 32, 1)
	unflattened := makeChain(t, filepath.Join(fixtures, "unflattened"), 91, 32, 2)
	broken := makeChain(t, filepath.Join(fixtures, "broken"), 92, 32, 1)
	stagedTop := importChain(t, sn, staged, "staged")
	unflattenedTop := importChain(t, sn, unflattened, "unflattened")
	brokenTop := importChain(t, sn, broken, "broken")
	for _, top := range []string{stagedTop, brokenTop} {
		if _, err := sn.Prepare(ctx, "ctr-"+top, top); err != nil {
			t.Fatal(err)
		}
	}
	if err := sn.Remove(ctx, "ctr-"+brokenTop); err != nil {
		t.Fatal(err)
	}
	// broken's committed link loses its state file: staging it again fails
	// after the memory hard link of its flat file is made.
	removeFromLink(t, filepath.Join(sn.dir(snapshotID(t, sn, brokenTop)), "qemu.state"))

	tests := []struct {
		name   string
		create func(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error)
		key    string
		parent string
		check  func(error) bool
	}{
		{"existing key on a flattened chain", sn.Prepare, "ctr-" + stagedTop, stagedTop, errdefs.IsAlreadyExists},
		{"existing key on an unflattened chain", sn.Prepare, "ctr-" + stagedTop, unflattenedTop, errdefs.IsAlreadyExists},
		{"existing key as a view", sn.View, "ctr-" + stagedTop, unflattenedTop, errdefs.IsAlreadyExists},
		{"existing key as an unpack", sn.Prepare, stagedTop, "", errdefs.IsAlreadyExists},
		{"state file missing", sn.Prepare, "ctr-broken", brokenTop, func(err error) bool { return err != nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.create(ctx, tc.key, tc.parent)
			if !tc.check(err) {
				t.Fatalf("create %s on %q: %v, want it to fail", tc.key, tc.parent, err)
			}
			t.Logf("error: %v", err)
		})
	}

	if n := flattens.Load(); n != 2 {
		t.Errorf("%d flattens, want 2 (staged, broken): a Prepare of an existing key flattened", n)
	}
	for _, f := range []struct {
		fx    fixture
		nlink uint64
	}{{staged, 2}, {broken, 1}} {
		if n := stat(t, flatPath(t, root, f.fx.dirs[0])).Nlink; n != f.nlink {
			t.Errorf("flat file of %s has nlink %d, want %d: a failed Prepare left a hard link", f.fx.dirs[0], n, f.nlink)
		}
	}
	if _, err := os.Stat(flatPath(t, root, unflattened.dirs[1])); !os.IsNotExist(err) {
		t.Errorf("a Prepare of an existing key flattened its chain (err %v)", err)
	}
	des, err := os.ReadDir(filepath.Join(root, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var snaps int
	if err := sn.Walk(ctx, func(context.Context, snapshots.Info) error { snaps++; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(des) != snaps {
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		t.Errorf("snapshot dirs %v for %d snapshots: a failed Prepare left a dir", names, snaps)
	}
}

// snapshotID returns the ID (dir name) of the snapshot key.
func snapshotID(t *testing.T, sn *Snapshotter, key string) string {
	t.Helper()
	var id string
	err := sn.ms.WithTransaction(context.Background(), false, func(ctx context.Context) error {
		var err error
		id, _, _, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}
