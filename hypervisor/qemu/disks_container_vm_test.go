package qemu

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// guestContainers is where the guest's agent keeps its containers.
const guestContainers = "/run/cocoon/containers"

// TestContainerJoinsFromDiskSlot restores a VM baked with spare disk
// slots and has containers join it through the real agent and the guest's
// runc, each with its root on an erofs image attached to a slot while the
// VM runs: the first on slot 0, a second from another image on slot 1
// beside it. Each reads the copy of its bind source and its image's
// file, and writes to its root (a private upper). A third container on
// slot 0's disk, one with both roots, and one without a PID namespace are
// refused by class. Once both are deleted, both slots detach, and a third
// container on slot 0 with another image reads that image's file, though
// the guest did not probe the slot again (its capacity, 1 TiB since boot,
// holds the image). Once it is deleted too the guest has no container
// mount or dir left.
func TestContainerJoinsFromDiskSlot(t *testing.T) {
	d := newTestDriver(t)
	s := newStager(t, t.TempDir(), bakedSlotsLink(t, d))
	v, c := restoreReady(t, d, hypervisor.RestoreRequest{StagedDir: s.stage(), RunDir: s.runDir(), Mode: hypervisor.ModeMmap})
	ctx := testContext(t, 3*time.Minute)
	var started []*joined
	for slot, id := range []string{"first", "second"} {
		img, text := containerImage(t)
		j := joinContainer(ctx, t, v, c, slot, id, img, "echo written > /new; cat /new; exec sleep 1000")
		if got, want := j.readLines(t, 3), j.bind+"\n"+text+"\nwritten\n"; got != want {
			t.Errorf("%s printed %q, want %q", id, got, want)
		}
		started = append(started, j)
	}
	testJoinRefused(ctx, t, c)
	if got := run(t, c, "/bin/sh", "-c", "grep -c "+guestContainers+" /proc/mounts || true"); got != "6" {
		t.Errorf("the guest has %s mounts under %s with two containers, want 6 (lower, rw and root each)", got, guestContainers)
	}
	for _, j := range started {
		j.remove(ctx, t, v, c)
	}
	img, text := containerImage(t)
	j := joinContainer(ctx, t, v, c, 0, "third", img, "true")
	if got, want := j.readLines(t, 2), j.bind+"\n"+text+"\n"; got != want {
		t.Errorf("third, on the first's slot, printed %q, want %q (its own image's, not the first's)", got, want)
	}
	j.remove(ctx, t, v, c)
	if got := run(t, c, "/bin/sh", "-c", "grep "+guestContainers+" /proc/mounts; ls -A "+guestContainers); got != "" {
		t.Errorf("the guest still has, after the containers were deleted:\n%s", got)
	}
}

// joined is a container that joined the VM, started.
type joined struct {
	id, bind string
	slot     int
	p        *agent.ContainerProcess
	stdout   io.ReadCloser
}

// joinContainer attaches img to slot and creates and starts container id
// on it, telling the guest img's size as the shim does, with a bind file
// of random text at /etc/bind.txt. Its process prints the bind file and
// /hello.txt, then runs script.
func joinContainer(ctx context.Context, t testing.TB, v *VM, c *agent.Client, slot int, id, img, script string) *joined {
	t.Helper()
	serial, err := v.AttachDisk(ctx, slot, img)
	if err != nil {
		t.Fatal(err)
	}
	j := &joined{id: id, bind: rand.Text(), slot: slot}
	src := path.Join(guestContainers, id, "binds", "0")
	spec := joinSpec(t, id, "cat /etc/bind.txt; echo; cat /hello.txt; echo; "+script,
		specs.Mount{Destination: "/etc/bind.txt", Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
	root := agent.ContainerRoot{Disk: &agent.Rootfs{FSType: "erofs", Serial: serial, Size: fileSize(t, img)}, Files: []agent.File{{Path: src, Data: []byte(j.bind), Mode: 0o444}}}
	if j.p, err = c.CreateContainerFrom(ctx, id, spec, root, false); err != nil {
		t.Fatalf("create %s on slot %d: %v", id, slot, err)
	}
	if _, err := c.StartContainer(ctx, id); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	_, j.stdout, _ = j.p.Stdio()
	return j
}

// readLines reads the container's output up to its nth newline.
func (j *joined) readLines(t testing.TB, n int) string {
	t.Helper()
	var b strings.Builder
	buf := make([]byte, 4096)
	for strings.Count(b.String(), "\n") < n {
		k, err := j.stdout.Read(buf)
		b.Write(buf[:k])
		if err != nil {
			t.Fatalf("read the output of %s: %v (so far %q)", j.id, err, b.String())
		}
	}
	return b.String()
}

// remove kills and deletes the container and detaches its slot.
func (j *joined) remove(ctx context.Context, t testing.TB, v *VM, c *agent.Client) {
	t.Helper()
	if err := j.p.Signal(ctx, syscall.SIGKILL, true); err != nil {
		t.Fatalf("kill %s: %v", j.id, err)
	}
	if _, err := j.p.Wait(ctx); err != nil {
		t.Fatalf("wait for %s: %v", j.id, err)
	}
	if err := c.DeleteContainer(ctx, j.id, ""); err != nil {
		t.Fatalf("delete %s: %v", j.id, err)
	}
	if err := v.DetachDisk(ctx, j.slot); err != nil {
		t.Fatalf("detach slot %d of %s: %v", j.slot, j.id, err)
	}
}

// testJoinRefused: what a joining container must not do is refused by
// class, naming what was wrong.
func testJoinRefused(ctx context.Context, t *testing.T, c *agent.Client) {
	taken := &agent.Rootfs{FSType: "erofs", Serial: diskSerial(0)}
	noPID := joinSpec(t, "nopid", "true")
	noPID.Linux.Namespaces = withoutPID(noPID.Linux.Namespaces)
	for _, tc := range []struct {
		name    string
		spec    *specs.Spec
		root    agent.ContainerRoot
		wantErr func(error) bool
		errHas  string
	}{
		{"disk-taken", joinSpec(t, "disk-taken", "true"), agent.ContainerRoot{Disk: taken}, errdefs.IsFailedPrecondition, diskSerial(0)},
		{"both-roots", joinSpec(t, "both-roots", "true"), agent.ContainerRoot{Dir: "/", Disk: taken}, errdefs.IsInvalidArgument, "expected one of them"},
		{"nopid", noPID, agent.ContainerRoot{Disk: &agent.Rootfs{FSType: "erofs", Serial: diskSerial(2)}}, errdefs.IsInvalidArgument, "needs a PID namespace of its own or its pod's"},
	} {
		_, err := c.CreateContainerFrom(ctx, tc.name, tc.spec, tc.root, false)
		if err == nil || !tc.wantErr(err) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: error %v, want one naming %q of the right class", tc.name, err, tc.errHas)
		}
	}
}

func withoutPID(in []specs.LinuxNamespace) []specs.LinuxNamespace {
	var out []specs.LinuxNamespace
	for _, ns := range in {
		if ns.Type != specs.PIDNamespace {
			out = append(out, ns)
		}
	}
	return out
}

// joinSpec is containerd's default spec for a container running script
// with sh, with mounts added.
func joinSpec(t testing.TB, id, script string, mounts ...specs.Mount) *specs.Spec {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "cocoon-test")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: id}, oci.WithDefaultPathEnv,
		oci.WithProcessArgs("sh", "-c", script), oci.WithMounts(mounts))
	if err != nil {
		t.Fatalf("generate spec: %v", err)
	}
	return s
}

// containerImage makes an erofs image of a busybox root (the static
// busybox and a link per applet) holding hello.txt, a random text it
// returns.
func containerImage(t testing.TB) (string, string) {
	t.Helper()
	mkfs := testenv.LookPath(t, "mkfs.erofs")
	bb := testenv.LookPath(t, "busybox")
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if err := os.Symlink("busybox", filepath.Join(src, "bin", applet)); err != nil && !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
	}
	text := rand.Text()
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "root.erofs")
	if out, err := exec.Command(mkfs, "--quiet", img, src).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	return img, text
}

// fileSize is the size of the file at path.
func fileSize(t testing.TB, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(st.Size())
}
