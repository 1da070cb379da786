package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// fakeRoots hands out a busybox root for any disk and records what is
// mounted, by bundle.
type fakeRoots struct {
	root string
	fail error // Mount's error, if set

	mu      sync.Mutex
	mounted []string
}

func (f *fakeRoots) Mount(_ context.Context, _ *api.Rootfs, dir string, clk *api.Clock) (string, error) {
	clk.Lap(api.PhaseDisk)
	if f.fail != nil {
		return "", f.fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mounted = append(f.mounted, dir)
	return f.root, nil
}

func (f *fakeRoots) Unmount(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.Index(f.mounted, dir)
	if i < 0 {
		return errors.New("not mounted: " + dir)
	}
	f.mounted = slices.Delete(f.mounted, i, i+1)
	return nil
}

func (f *fakeRoots) MountVolume(_ context.Context, v *api.VolumeDisk) error {
	if v.Serial == "broken" {
		return errors.New("no such disk")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mounted = append(f.mounted, v.Path)
	return nil
}

func (f *fakeRoots) UnmountVolume(v *api.VolumeDisk) error { return f.Unmount(v.Path) }

func (f *fakeRoots) left() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.mounted)
}

// TestRootDisk: a container on a disk gets the root Roots mounted and its
// files; a second container on the same disk is refused naming it; delete,
// and every create that fails after the mount, unmount it and free the
// disk, and leave no bundle.
func TestRootDisk(t *testing.T) {
	m := testManager(t)
	roots := &fakeRoots{root: busyboxRoot(t)}
	m.cfg.Roots = roots
	ctx := context.Background()
	disk := &api.Rootfs{Fstype: "erofs", Serial: "cocoon-disk-0"}
	bind := filepath.Join(m.cfg.StateDir, "one", "binds", "0")
	spec := specJSON(t, "one", oci.WithProcessArgs("cat", "/etc/bind.txt"), oci.WithMounts(nil))
	c, err := m.Create(ctx, "one", CreateOptions{Spec: spec, RootDisk: disk, Files: []*api.File{{Path: bind, Data: []byte("bound")}}})
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(bind); err != nil || string(data) != "bound" {
		t.Errorf("bind file %q, %v; want bound", data, err)
	}
	var names []string
	for _, p := range c.Phases {
		names = append(names, p.GetName())
	}
	// This manager's containers are runc's (the host's runc).
	if want := []string{api.PhaseDisk, api.PhaseRoot, api.PhaseBundle, api.PhaseRuncCreate}; !slices.Equal(names, want) {
		t.Errorf("create on a disk timed %v, want %v", names, want)
	}
	_, err = m.Create(ctx, "two", CreateOptions{Spec: specJSON(t, "two"), RootDisk: disk})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), disk.Serial) {
		t.Errorf("a second container on %s: %v, want FailedPrecondition naming it", disk.Serial, err)
	}
	if got := roots.left(); len(got) != 1 {
		t.Errorf("mounted %q, want one container's root", got)
	}
	if err := m.Delete(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	badMount := oci.WithMounts([]specs.Mount{{Destination: "/x", Type: "nosuchfs", Source: "none"}})
	for _, tc := range []struct {
		name   string
		spec   []byte
		files  []*api.File
		errHas string
	}{
		{"files", specJSON(t, "files"), []*api.File{{Path: "/proc/version/x", Data: []byte("x")}}, "write /proc/version/x"},
		{"runc", specJSON(t, "runc", badMount), nil, "create container \"runc\""},
	} {
		_, err := m.Create(ctx, tc.name, CreateOptions{Spec: tc.spec, RootDisk: disk, Files: tc.files})
		if err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.errHas)
		}
	}
	roots.fail = errors.New("no such disk")
	if _, err := m.Create(ctx, "nodisk", CreateOptions{Spec: specJSON(t, "nodisk"), RootDisk: disk}); err == nil || !strings.Contains(err.Error(), "no such disk") {
		t.Errorf("a failed mount: %v, want its error", err)
	}
	if got := roots.left(); len(got) != 0 {
		t.Errorf("still mounted: %q", got)
	}
	if entries, _ := os.ReadDir(m.cfg.StateDir); len(entries) != 0 {
		t.Errorf("bundles left: %v", entries)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.disks) != 0 {
		t.Errorf("disks still claimed: %v", m.disks)
	}
}

// TestVolumeDisks: a container's volume disks are mounted before runc runs
// and unmounted at delete; a disk another container holds is refused, and
// a volume that fails to mount leaves nothing mounted or claimed.
func TestVolumeDisks(t *testing.T) {
	m := testManager(t)
	roots := &fakeRoots{root: busyboxRoot(t)}
	m.cfg.Roots = roots
	ctx := context.Background()
	disk := &api.Rootfs{Fstype: "erofs", Serial: "cocoon-disk-0"}
	vol := &api.VolumeDisk{Fstype: "erofs", Serial: "cocoon-disk-1", Path: "/run/cocoon/binds/one/image-0"}
	c, err := m.Create(ctx, "one", CreateOptions{Spec: specJSON(t, "one", oci.WithProcessArgs("true")), RootDisk: disk, Volumes: []*api.VolumeDisk{vol}})
	if err != nil {
		t.Fatal(err)
	}
	if got := roots.left(); len(got) != 2 || got[1] != vol.Path {
		t.Fatalf("mounted %q, want the root and the volume", got)
	}
	other := &api.Rootfs{Fstype: "erofs", Serial: "cocoon-disk-2"}
	for _, tc := range []struct {
		name string
		vols []*api.VolumeDisk
		want string
	}{
		{"held", []*api.VolumeDisk{vol}, vol.Serial},
		{"broken", []*api.VolumeDisk{{Fstype: "erofs", Serial: "cocoon-disk-3", Path: "/a"}, {Fstype: "erofs", Serial: "broken", Path: "/b"}}, "no such disk"},
	} {
		_, err := m.Create(ctx, tc.name, CreateOptions{Spec: specJSON(t, tc.name), RootDisk: other, Volumes: tc.vols})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if err := m.Delete(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if got := roots.left(); len(got) != 0 {
		t.Errorf("still mounted: %q", got)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.disks) != 0 {
		t.Errorf("disks still claimed: %v", m.disks)
	}
}
