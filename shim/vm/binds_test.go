package vm

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

const secret = "host secret 4f1c"

// outside is a directory beside a bind source, holding a 0600 secret and a
// FIFO; its watch reports every file in it that is opened.
func outside(t *testing.T) (string, func() []string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, testenv.WatchOpens(t, dir)
}

// tree makes entries under a new directory; see mkTree.
func tree(t *testing.T, entries ...string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "src")
	mkTree(t, root, entries...)
	return root
}

// mkTree makes the directory root (0777, as an emptyDir) and entries under
// it: "d/" a directory, "l>target" a link, "p|" a FIFO, anything else a
// file holding its own name.
func mkTree(t *testing.T, root string, entries ...string) {
	t.Helper()
	if err := os.Mkdir(root, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o777); err != nil { // whatever the umask
		t.Fatal(err)
	}
	for _, e := range entries {
		var err error
		switch {
		case strings.HasSuffix(e, "/"):
			err = os.MkdirAll(filepath.Join(root, e), 0o750)
		case strings.Contains(e, ">"):
			name, target, _ := strings.Cut(e, ">")
			err = os.Symlink(target, filepath.Join(root, name))
		case strings.HasSuffix(e, "|"):
			err = unix.Mkfifo(filepath.Join(root, strings.TrimSuffix(e, "|")), 0o644)
		default:
			err = os.WriteFile(filepath.Join(root, e), []byte(e), 0o640)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// rel is the relative path from dir to p.
func rel(t *testing.T, dir, p string) string {
	t.Helper()
	r, err := filepath.Rel(dir, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// listing is files as "path mode [data]" lines, paths relative to dst.
func listing(files []agent.File, dst string) []string {
	var out []string
	for _, f := range files {
		line := strings.TrimPrefix(strings.TrimPrefix(f.Path, dst), "/") + " " + f.Mode.String()
		if len(f.Data) > 0 {
			line += " " + string(f.Data)
		}
		out = append(out, line)
	}
	return out
}

// TestBindCopyTree: a bind source's tree is copied as it is, empty
// directories and links included; a link that resolves inside the source
// keeps its target.
func TestBindCopyTree(t *testing.T) {
	const dst = "/run/cocoon/binds/0"
	for _, tc := range []struct {
		name    string
		entries []string
		want    []string
	}{
		{"empty directory", nil, []string{" drwxrwxrwx"}},
		{"tree of empty directories", []string{"a/b/c/", "d/"}, []string{
			" drwxrwxrwx", "a drwxr-x---", "a/b drwxr-x---", "a/b/c drwxr-x---", "d drwxr-x---"}},
		{"configmap", []string{"..2026_12_01_10_00_00.1/", "..2026_12_01_10_00_00.1/key", "..data>..2026_12_01_10_00_00.1", "key>..data/key"}, []string{
			" drwxrwxrwx", "..2026_12_01_10_00_00.1 drwxr-x---",
			"..2026_12_01_10_00_00.1/key -rw-r----- ..2026_12_01_10_00_00.1/key",
			"..data Lrwxrwxrwx ..2026_12_01_10_00_00.1", "key Lrwxrwxrwx ..data/key"}},
		{"links inside", []string{"a/", "a/f", "a/up>../b", "b>a/f", "dangling>nothing"}, []string{
			" drwxrwxrwx", "a drwxr-x---", "a/f -rw-r----- a/f", "a/up Lrwxrwxrwx ../b", "b Lrwxrwxrwx a/f", "dangling Lrwxrwxrwx nothing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &binds{budget: testCopies()}
			if err := b.copy(tree(t, tc.entries...), dst); err != nil {
				t.Fatal(err)
			}
			if got := listing(b.files, dst); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("copied\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestBindCopyLinksOut: links out of a bind source (absolute, "../..", to
// a device or a FIFO) are copied as links that resolve inside the copy;
// nothing outside the source is opened or read.
func TestBindCopyLinksOut(t *testing.T) {
	const dst = "/run/cocoon/binds/0"
	out, opened := outside(t)
	for _, tc := range []struct {
		name   string
		target func(src string) string
		want   string // the copy's target from the source's root; "" for the lexical one
	}{
		{"absolute", func(string) string { return filepath.Join(out, "secret") }, ""},
		{"relative", func(src string) string { return rel(t, filepath.Join(src, "dir"), filepath.Join(out, "secret")) }, ""},
		{"far up", func(string) string { return "../../../../../../../../.." + out + "/secret" }, ""},
		{"device", func(string) string { return "/dev/tty0" }, "dev/tty0"},
		{"fifo", func(string) string { return filepath.Join(out, "fifo") }, ""},
		{"up through a link to the root", func(string) string { return "../sub/../../x" }, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			target := tc.target(src)
			mkTree(t, src, "sub>.", "dir/", "dir/link>"+target)
			want := tc.want
			if want == "" {
				want = path.Clean(path.Join("/dir", target))[1:]
				if path.IsAbs(target) {
					want = path.Clean(target)[1:]
				}
			}
			b := &binds{budget: testCopies()}
			if err := b.copy(src, dst); err != nil {
				t.Fatal(err)
			}
			link := b.files[slices.IndexFunc(b.files, func(f agent.File) bool { return f.Path == dst+"/dir/link" })]
			if link.Path != dst+"/dir/link" || link.Mode.Type() != fs.ModeSymlink || string(link.Data) != "../"+want {
				t.Fatalf("link to %s copied as %q %v %q, want a link to %q", target, link.Path, link.Mode, link.Data, "../"+want)
			}
			if p := path.Join(path.Dir(link.Path), string(link.Data)); !strings.HasPrefix(p, dst+"/") {
				t.Fatalf("the copy's link resolves to %s, outside the copy", p)
			}
			for _, f := range b.files {
				if bytes.Contains(f.Data, []byte(secret)) {
					t.Fatalf("%s holds the host's secret", f.Path)
				}
			}
			if names := opened(); len(names) > 0 {
				t.Fatalf("copying opened %v outside the bind source", names)
			}
		})
	}
}

// TestBindCopyRefusals: a FIFO, socket or device inside a bind source, or
// too many entries, fail the copy naming what, and nothing is opened.
func TestBindCopyRefusals(t *testing.T) {
	many := make([]string, 8)
	for i := range many {
		many[i] = "d" + string(rune('a'+i)) + "/"
	}
	for _, tc := range []struct {
		name    string
		entries []string
		device  bool
		want    string
	}{
		{"fifo", []string{"sub/", "sub/fifo|"}, false, "sub/fifo is a FIFO"},
		{"device", []string{"sub/"}, true, "sub/tty is a character device"},
		{"link loop", []string{"sub/", "sub/a>b", "sub/b>a"}, false, "sub/a -> b: resolve inside the bind source"},
		{"too many", append(many, "sub/"), false, "a copy of 9 files, directories and links (or more), with the 2 the VM's copies hold already, is over shim.copy_files = 10"},
		{"too large", []string{"sub/", "sub/abcdefghijklmnopqrstuvwxyz"}, false, "a copy of 30B of file data (or more), with the 24B the VM's copies hold already, is over shim.copy_bytes = 40B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tree(t, tc.entries...)
			if tc.device {
				testenv.RequireRoot(t)
				if err := unix.Mknod(filepath.Join(src, "sub/tty"), unix.S_IFCHR|0o600, int(unix.Mkdev(5, 0))); err != nil {
					t.Fatal(err)
				}
			}
			opened := testenv.WatchOpens(t, filepath.Join(src, "sub"))
			copies := &copyBudget{limit: copyUsage{files: 10, bytes: 40}, held: copyUsage{files: 2, bytes: 24}}
			err := (&binds{budget: copies}).copy(src, "/run/cocoon/binds/0")
			if names := opened(); len(names) > 0 {
				t.Fatalf("copying opened %v", names)
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("copy: %v, want invalid argument saying %q", err, tc.want)
			}
		})
	}
}

// TestBindTranslateRefusals: a bind of a FIFO or a device, and a mount of
// a type the VM cannot make, are invalid arguments naming the source or
// type, never NotImplemented (containerd takes that from Create to mean the
// task API is unsupported); the FIFO is never opened.
func TestBindTranslateRefusals(t *testing.T) {
	out, opened := outside(t)
	for _, tc := range []struct {
		name string
		m    specs.Mount
		want string
	}{
		{"fifo", specs.Mount{Destination: "/x", Type: "bind", Source: filepath.Join(out, "fifo")}, "fifo is a FIFO: a cocoon VM takes copies of regular files and directories only"},
		{"device", specs.Mount{Destination: "/x", Type: "bind", Source: "/dev/zero"}, "/dev/zero is a character device"},
		{"nfs", specs.Mount{Destination: "/x", Type: "nfs", Source: "srv:/export"}, `mount of type "nfs" from "srv:/export": a cocoon VM takes bind mounts and mounts of type [proc`},
		{"rshared", specs.Mount{Destination: "/x", Type: "bind", Source: out, Options: []string{"rbind", "rshared"}}, "asks for shared propagation (Kubernetes' mountPropagation: Bidirectional)"},
		{"shared", specs.Mount{Destination: "/x", Type: "bind", Source: out, Options: []string{"bind", "shared", "rw"}}, "use HostToContainer (rslave)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (&binds{budget: testCopies()}).translate(tc.m)
			if !errdefs.IsInvalidArgument(err) || errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("translate: %v, want invalid argument saying %q", err, tc.want)
			}
			if names := opened(); len(names) > 0 {
				t.Fatalf("translate opened %v", names)
			}
		})
	}
}

// TestIdentityFiles: a snapshot image's resolver and hosts files are read
// from regular files; a FIFO or a device in their place is refused
// unopened.
func TestIdentityFiles(t *testing.T) {
	out, opened := outside(t)
	hosts := filepath.Join(out, "hosts")
	if err := os.WriteFile(hosts, []byte("10.0.0.2 c1\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, source, want string
	}{
		{"file", hosts, ""},
		{"fifo", filepath.Join(out, "fifo"), "fifo is a FIFO, expected a regular file"},
		{"device", "/dev/zero", "/dev/zero is a character device, expected a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{Mounts: []specs.Mount{{Destination: "/etc/hosts", Type: "bind", Source: tc.source, Options: []string{"rbind", "ro"}}}}
			g, err := guestSetup(spec, nil, testCopies(), nil)
			files := g.files
			if tc.want == "" {
				if err != nil || len(files) != 1 || string(files[0].Data) != "10.0.0.2 c1\n" || files[0].Mode != 0o640 {
					t.Fatalf("guestSetup: %+v, %v", files, err)
				}
				opened() // the hosts file, read as it should be
				return
			}
			if names := opened(); len(names) > 0 {
				t.Fatalf("guestSetup opened %v", names)
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("guestSetup: %v, want invalid argument saying %q", err, tc.want)
			}
		})
	}
}

// TestBindPodDirs: a pod's containers binding one host directory get one
// copy of it in the guest, made by the first; files stay each container's.
func TestBindPodDirs(t *testing.T) {
	host := t.TempDir()
	dir := filepath.Join(host, "empty-dir")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(host, "hosts")
	if err := os.WriteFile(file, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := newSharedDirs(podBindSources, nil)
	mounts := []specs.Mount{
		{Destination: "/data", Type: "bind", Source: dir, Options: []string{"rbind", "rw"}},
		{Destination: "/again", Type: "bind", Source: dir + "/", Options: []string{"rbind", "ro"}},
		{Destination: "/etc/hosts", Type: "bind", Source: file, Options: []string{"rbind", "ro"}},
	}
	translate := func(id string) (*binds, []specs.Mount) {
		b := &binds{dir: memberBindSources(id), pod: pod, budget: testCopies()}
		var out []specs.Mount
		for _, m := range mounts {
			gm, err := b.translate(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, gm...)
		}
		return b, out
	}
	first, a := translate("a")
	if a[0].Source != a[1].Source || !strings.HasPrefix(a[0].Source, podBindSources+"/") {
		t.Fatalf("one directory bound twice went to %s and %s, want one copy under %s", a[0].Source, a[1].Source, podBindSources)
	}
	if len(first.copied) != 1 || len(first.files) != 2 {
		t.Fatalf("the first container copies the directory once and its file: copied %v, files %+v", first.copied, first.files)
	}
	pod.keep(context.Background(), first.copied, first.files)
	second, b := translate("b")
	if b[0].Source != a[0].Source {
		t.Fatalf("the second container binds %s, want the pod's copy %s", b[0].Source, a[0].Source)
	}
	if len(second.copied) != 0 || len(second.files) != 1 || second.files[0].Path != b[2].Source || b[2].Source == a[2].Source {
		t.Fatalf("the second container copies only its own file: copied %v, files %+v", second.copied, second.files)
	}
	// Its copies are under a dir of its own, which goes with it.
	if !strings.HasPrefix(b[2].Source, memberBindSources("b")+"/") {
		t.Fatalf("the second container's file went to %s, want under its own dir %s", b[2].Source, memberBindSources("b"))
	}
	if b[1].Options[1] != "ro" {
		t.Fatalf("a bind's own options stay: %v", b[1].Options)
	}
}

// TestBindSubmounts: a read-only bind leaves the mounts under its source
// writable, as runc's does; a recursive one (rro) does not.
func TestBindSubmounts(t *testing.T) {
	testenv.RequireRoot(t)
	src := t.TempDir()
	sub := filepath.Join(src, "tmpfs")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("none", sub, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	for _, tc := range []struct {
		opts []string
		want []string // each mount: destination and options
	}{
		{[]string{"rbind", "rprivate", "ro"}, []string{"/mnt rbind rprivate ro", "/mnt/tmpfs rbind rw"}},
		{[]string{"rbind", "rprivate", "rro"}, []string{"/mnt rbind rprivate ro"}},
		{[]string{"rbind", "rprivate", "rw"}, []string{"/mnt rbind rprivate rw"}},
	} {
		t.Run(strings.Join(tc.opts, ","), func(t *testing.T) {
			got, err := (&binds{budget: testCopies()}).translate(specs.Mount{Destination: "/mnt", Type: "bind", Source: src, Options: tc.opts})
			if err != nil {
				t.Fatal(err)
			}
			var desc []string
			for _, m := range got {
				desc = append(desc, m.Destination+" "+strings.Join(m.Options, " "))
			}
			if !slices.Equal(desc, tc.want) {
				t.Fatalf("got %q, want %q", desc, tc.want)
			}
			if len(got) == 2 && got[1].Source != got[0].Source+"/tmpfs" {
				t.Fatalf("the submount binds %s, want the copy's %s", got[1].Source, got[0].Source+"/tmpfs")
			}
		})
	}
}

func testCopies() *copyBudget {
	return newCopyBudget(config.Default().Shim)
}

// TestBindCopyTmpfs: the copy of a directory that is a tmpfs's root (a
// memory-backed emptyDir, which kubelet mounts with its sizeLimit) is a
// tmpfs of the same size in the guest; a directory under it is not.
func TestBindCopyTmpfs(t *testing.T) {
	testenv.RequireRoot(t)
	dir := tree(t)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src  string
		want int64
	}{{dir, 1 << 20}, {filepath.Join(dir, "sub"), 0}} {
		b := &binds{budget: testCopies()}
		if err := b.copy(tc.src, "/run/cocoon/binds/0"); err != nil {
			t.Fatal(err)
		}
		if got := b.files[0].TmpfsSize; got != tc.want || !b.files[0].Mode.IsDir() {
			t.Errorf("copy of %s: tmpfs size %d, want %d", tc.src, got, tc.want)
		}
	}
}

// TestGuestSetupShares: with shares, a VM's bind of a plain directory is
// a share (one per directory and access), while a file, a Kubernetes live
// volume and a tmpfs's root are still copied.
func TestGuestSetupShares(t *testing.T) {
	testenv.RequireRoot(t)
	plain, file := tree(t), filepath.Join(tree(t), "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(t.TempDir(), "volumes", "kubernetes.io~configmap", "cfg")
	if err := os.MkdirAll(live, 0o755); err != nil {
		t.Fatal(err)
	}
	mem := t.TempDir()
	if err := unix.Mount("tmpfs", mem, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mem, unix.MNT_DETACH) })
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/a", Type: "bind", Source: plain, Options: []string{"rbind", "rw"}},
		{Destination: "/b", Type: "bind", Source: plain, Options: []string{"rbind", "ro"}},
		{Destination: "/c", Type: "bind", Source: plain, Options: []string{"rbind", "rw"}},
		{Destination: "/f", Type: "bind", Source: file, Options: []string{"rbind", "ro"}},
		{Destination: "/cfg", Type: "bind", Source: live, Options: []string{"rbind", "ro"}},
		{Destination: "/mem", Type: "bind", Source: mem, Options: []string{"rbind", "rw"}},
	}}
	g, err := guestSetup(spec, &chain.StagedRootfs{FSType: "erofs"}, testCopies(), newVMShares())
	if err != nil {
		t.Fatal(err)
	}
	src := map[string]string{}
	for _, m := range g.root.Mounts {
		src[m.Destination] = m.Source
	}
	want := map[string]string{"/a": shareSources + "/1", "/b": shareSources + "/2", "/c": shareSources + "/1"}
	for dst, s := range want {
		if src[dst] != s {
			t.Errorf("%s binds %q, want the share %q", dst, src[dst], s)
		}
	}
	for _, dst := range []string{"/f", "/cfg", "/mem"} {
		if !strings.HasPrefix(src[dst], bindSources+"/") || strings.HasPrefix(src[dst], shareSources) {
			t.Errorf("%s binds %q, want a copy", dst, src[dst])
		}
	}
	if len(g.shares) != 2 {
		t.Errorf("shares %v, want 2 (rw and ro of one directory)", g.shares)
	}
}

// TestGuestRootConfinement: a snapshot image's processes get a confined
// guest root (a Rootfs without a disk) only when the spec asks for a
// read-only root, with its masked and read-only paths; a pod's sandbox
// never.
func TestGuestRootConfinement(t *testing.T) {
	linux := &specs.Linux{MaskedPaths: []string{"/proc/kcore"}, ReadonlyPaths: []string{"/proc/sys"}}
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		want *agent.Rootfs
	}{
		{"no spec", nil, nil},
		{"writable root", &specs.Spec{Root: &specs.Root{Path: "rootfs"}, Linux: linux}, nil},
		{"read-only root", &specs.Spec{Root: &specs.Root{Path: "rootfs", Readonly: true}, Linux: linux},
			&agent.Rootfs{Readonly: true, MaskedPaths: linux.MaskedPaths, ReadonlyPaths: linux.ReadonlyPaths}},
		{"a pod's sandbox", &specs.Spec{Root: &specs.Root{Path: "rootfs", Readonly: true}, Linux: linux,
			Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := guestSetup(tc.spec, nil, testCopies(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g.root, tc.want) {
				t.Errorf("root %+v, want %+v", g.root, tc.want)
			}
		})
	}
}
