package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// bindFlag is ctr's --mount of host dir src at dst in the container.
func bindFlag(src, dst, mode string) []string {
	return []string{"--mount", "type=bind,src=" + src + ",dst=" + dst + ",options=rbind:" + mode}
}

// mkdirs makes each directory (with its parents) mode perm, whatever the
// umask.
func mkdirs(t *testing.T, perm os.FileMode, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, perm); err != nil {
			t.Fatal(err)
		}
	}
}

// symlinks makes links, name -> target in pairs.
func symlinks(t *testing.T, pairs ...string) {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if err := os.Symlink(pairs[i+1], pairs[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBindLinksOut: a bind-mounted directory holding links to a 0600 host
// file outside it (absolute and "../.."), and to /dev/tty0, beside a
// Kubernetes configmap's ..data layout: the container starts, the
// configmap's key reads through its links, the links out keep their
// targets, as under runc, and resolve in the guest, where the host's file
// is not: the directory is shared (shim/share), and the shim's helper
// serves nothing outside it. The host file is never opened.
func TestBindLinksOut(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef)
	secretDir := t.TempDir()
	const secret = "host secret 9b7e"
	if err := os.WriteFile(filepath.Join(secretDir, "secret"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(t.TempDir(), "vol")
	data := filepath.Join(vol, "..2026_12_01_10_00_00.1")
	mkdirs(t, 0o755, data)
	if err := os.WriteFile(filepath.Join(data, "key"), []byte("configmap value\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	up, err := filepath.Rel(vol, filepath.Join(secretDir, "secret"))
	if err != nil {
		t.Fatal(err)
	}
	symlinks(t,
		filepath.Join(vol, "..data"), filepath.Base(data),
		filepath.Join(vol, "key"), "..data/key",
		filepath.Join(vol, "abs"), filepath.Join(secretDir, "secret"),
		filepath.Join(vol, "up"), up,
		filepath.Join(vol, "tty"), "/dev/tty0")
	opened := testenv.WatchOpens(t, secretDir)
	out, err := runOrdinary(c, append([]string{"--rm"}, bindFlag(vol, "/mnt/x", "rw")...), "links",
		"sh", "-c", "cat /mnt/x/key; for f in abs up tty; do echo $f $(readlink /mnt/x/$f); cat /mnt/x/$f 2>&1; done; true")
	if err != nil {
		t.Fatalf("run with links out of the bind: %v\n%s", err, out)
	}
	t.Logf("the container printed:\n%s", out)
	if strings.Contains(out, secret) {
		t.Fatalf("the host's 0600 file reached the container:\n%s", out)
	}
	for _, want := range []string{
		"configmap value",
		"abs " + filepath.Join(secretDir, "secret"),
		"up " + up,
		"tty /dev/tty0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the container printed\n%s\nwant a line with %q", out, want)
		}
	}
	if names := opened(); len(names) > 0 {
		t.Fatalf("the shim opened %v outside the bind's source", names)
	}
}

// TestBindEmptyDirectories: an empty directory (an emptyDir at pod start)
// and a tree of empty directories mount; read-write they take writes,
// which are the host's directory's, read-only they refuse them.
func TestBindEmptyDirectories(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef)
	empty := filepath.Join(t.TempDir(), "empty")
	tree := filepath.Join(t.TempDir(), "tree")
	mkdirs(t, 0o777, empty)
	mkdirs(t, 0o755, filepath.Join(tree, "a/b/c"), filepath.Join(tree, "d"))
	script := "ls -ld /mnt/e | cut -c1-10; find /mnt/t | sort; touch /mnt/e/x 2>&1 && touch /mnt/t/a/b/c/y 2>&1 && ls /mnt/e /mnt/t/a/b/c; true"
	for _, tc := range []struct {
		mode string
		want []string
	}{
		{"rw", []string{"drwxrwxrwx", "/mnt/t/a/b/c\n/mnt/t/d", "/mnt/e:\nx", "/mnt/t/a/b/c:\ny"}},
		// The read-write run's write is there: the host's directory.
		{"ro", []string{"drwxrwxrwx", "/mnt/t/a/b/c/y\n/mnt/t/d", "Read-only file system"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			flags := append([]string{"--rm"}, bindFlag(empty, "/mnt/e", tc.mode)...)
			flags = append(flags, bindFlag(tree, "/mnt/t", tc.mode)...)
			out, err := runOrdinary(c, flags, "empty-"+tc.mode, "sh", "-c", script)
			if err != nil {
				t.Fatalf("run with empty directories bound %s: %v\n%s", tc.mode, err, out)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("the container printed\n%s\nwant %q", out, want)
				}
			}
			if tc.mode == "ro" && strings.Contains(out, "/mnt/e:\nx") {
				t.Errorf("a read-only empty directory took a write:\n%s", out)
			}
		})
	}
	for _, f := range []string{filepath.Join(empty, "x"), filepath.Join(tree, "a/b/c/y")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the read-write container's write is not on the host: %v", err)
		}
	}
}

// TestBindRefusals: a bind of a FIFO or a device, and a mount of a type
// the VM cannot make, fail the create naming the mount and why (an invalid
// argument: NotImplemented would make containerd retry the create on task
// API v2 and hide it), and nothing of the task stays.
func TestBindRefusals(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		mount string
		want  string
	}{
		{"fifo", "type=bind,src=" + fifo + ",dst=/mnt/f,options=rbind:ro", "mount at /mnt/f: bind source " + fifo + " is a FIFO"},
		{"device", "type=bind,src=/dev/zero,dst=/mnt/z,options=rbind:ro", "mount at /mnt/z: bind source /dev/zero is a character device"},
		{"nfs", "type=nfs,src=srv:/export,dst=/mnt/n,options=ro", `mount at /mnt/n: mount of type "nfs" from "srv:/export"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runOrdinary(c, []string{"--rm", "--mount", tc.mount}, "refused-"+tc.name, "true")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run with %s: %v\n%s\nwant an error saying %q", tc.mount, err, out, tc.want)
			}
			if pids := c.InUse(); len(pids) > 0 {
				t.Fatalf("processes still use the stack: %v", pids)
			}
		})
	}
}
