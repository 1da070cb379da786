package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestLoadRefusesHostileFiles: a config path must name a small regular
// file; anything else fails at once instead of hanging or filling memory.
func TestLoadRefusesHostileFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	if err := os.WriteFile(good, []byte("[restore]\nmode = \"copy\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.toml")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", maxFileSize)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, path, wantErr string }{
		{"device", "/dev/zero", "not a regular file"},
		{"fifo", fifo, "not a regular file"},
		{"directory", dir, "not a regular file"},
		{"symlink", link, "is a symbolic link"},
		{"too large", big, "larger than the 1048576 allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := Load(tt.path)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load(%s) error %v, want one containing %q", tt.path, err, tt.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Load(%s) still runs after 10s", tt.path)
			}
		})
	}
	if c, err := Load(os.DevNull); err != nil || !reflect.DeepEqual(c, Default()) {
		t.Fatalf("Load(%s) = %+v, %v; want the defaults", os.DevNull, c, err)
	}
	if c, err := Load(good); err != nil || c.Restore.Mode != "copy" {
		t.Fatalf("Load of a plain file: %+v, %v", c.Restore, err)
	}
}

// TestLoadHostKeysNeedTrustedFile: keys naming host paths or programs are
// honoured only from a root-owned file nobody else can write.
func TestLoadHostKeysNeedTrustedFile(t *testing.T) {
	testenv.RequireRoot(t)
	const nobody = 65534
	tests := []struct {
		name    string
		body    string
		uid     int
		mode    os.FileMode
		wantErr string
	}{
		{"root-owned sets a binary", "[qemu]\nbinary = \"/opt/qemu/bin/qemu\"\n", 0, 0o644, ""},
		{"root-owned read-only sets every host key", allHostKeys, 0, 0o400, ""},
		{"another user's file sets a binary", "[qemu]\nbinary = \"/tmp/evil\"\n", nobody, 0o644, "qemu.binary"},
		{"group-writable root file sets a binary", "[firecracker]\nbinary = \"/tmp/evil\"\n", 0, 0o664, "firecracker.binary"},
		{"world-writable root file sets the run dir", "[shim]\nrun_dir = \"/tmp/run\"\n", 0, 0o646, "shim.run_dir"},
		{"another user's file sets the snapshotter root", "[snapshotter]\nroot = \"/\"\n", nobody, 0o600, "snapshotter.root"},
		{"another user's file sets a dotted key", "cloud_hypervisor.binary = \"/tmp/evil\"\n", nobody, 0o644, "cloud_hypervisor.binary"},
		{"another user's file restates a default", "[qemu]\nbinary = \"qemu-system-x86_64\"\n", nobody, 0o644, ""},
		{"another user's file sets only policy", "[restore]\nmode = \"mmap\"\n[qemu]\naccel = \"tcg\"\n", nobody, 0o666, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.toml")
			if err := os.WriteFile(p, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, tt.uid, 0); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tt.mode); err != nil {
				t.Fatal(err)
			}
			_, err := Load(p)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "owned by root") {
				t.Fatalf("Load error %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}

const allHostKeys = `[shim]
run_dir = "/run/x"
pool_cgroup = "/x/pool"
pool_memory = "1G"
[qemu]
binary = "/x/qemu"
[cloud_hypervisor]
binary = "/x/ch"
[firecracker]
binary = "/x/fc"
[snapshotter]
root = "/x/root"
address = "/x/sock"
`

// notHostKeys are the string keys that name neither a path nor a program.
var notHostKeys = []string{
	"hypervisor", "restore.mode", "restore.force_mode", "restore.base_image", "restore.base_snapshotter", "qemu.accel", "qemu.cpu", "cloud_hypervisor.copy_on_write", "shim.pod_vm",
}

// TestHostKeysCoverPaths: every string key of the config is classified, so
// a new key naming a path or program cannot slip past hostKeys, and
// hostValues follows hostKeys.
func TestHostKeysCoverPaths(t *testing.T) {
	var keys []string
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		sec := ct.Field(i)
		if sec.Type.Kind() == reflect.String {
			keys = append(keys, sec.Tag.Get("toml"))
		}
		if sec.Type.Kind() != reflect.Struct {
			continue
		}
		for j := range sec.Type.NumField() {
			if f := sec.Type.Field(j); f.Type.Kind() == reflect.String {
				keys = append(keys, sec.Tag.Get("toml")+"."+f.Tag.Get("toml"))
			}
		}
	}
	for _, k := range keys {
		if !slices.Contains(hostKeys, k) && !slices.Contains(notHostKeys, k) {
			t.Errorf("string key %s is in neither hostKeys nor notHostKeys: does it name a host path or program?", k)
		}
	}
	c, err := Parse([]byte(allHostKeys))
	if err != nil {
		t.Fatal(err)
	}
	vals := c.hostValues()
	if len(vals) != len(hostKeys) {
		t.Fatalf("%d host values for %d host keys", len(vals), len(hostKeys))
	}
	for i, v := range vals {
		if v == "" || v == Default().hostValues()[i] {
			t.Errorf("%s = %q: hostValues does not follow hostKeys", hostKeys[i], v)
		}
	}
}
