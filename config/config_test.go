package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, in string
		wantErr  string
		check    func(t *testing.T, c Config)
	}{
		{name: "empty is defaults", in: "", check: func(t *testing.T, c Config) {
			if c.Restore.Mode != "auto" || c.Hypervisor != "qemu" || c.Agent.CallTimeout.D() != 10*time.Second {
				t.Errorf("defaults not applied: %+v", c)
			}
		}},
		{name: "values", in: "[restore]\nmode = \"copy\"\nallow_annotation = true\n[snapshotter]\nflat_cache_size = \"2GiB\"\n[agent]\ncall_timeout = \"250ms\"\n",
			check: func(t *testing.T, c Config) {
				if c.Restore.Mode != "copy" || !c.Restore.AllowAnnotation || c.Snapshotter.FlatCacheSize != 2<<30 || c.Agent.CallTimeout.D() != 250*time.Millisecond {
					t.Errorf("values not read: %+v", c)
				}
			}},
		{name: "unknown top key", in: "hypervsor = \"qemu\"\n", wantErr: "unknown key hypervsor"},
		{name: "unknown nested key", in: "[restore]\nmod = \"copy\"\n", wantErr: "unknown key restore.mod"},
		{name: "bad mode", in: "[restore]\nmode = \"mmapp\"\n", wantErr: `restore.mode: unknown restore mode "mmapp"`},
		{name: "bad force mode", in: "[restore]\nforce_mode = \"auto\"\n", wantErr: "restore.force_mode"},
		{name: "bad accel", in: "[qemu]\naccel = \"hvf\"\n", wantErr: "qemu.accel"},
		{name: "bad size", in: "[snapshotter]\nflat_cache_size = \"lots\"\n", wantErr: "bad size"},
		{name: "bad duration", in: "[agent]\nconnect_timeout = \"soon\"\n", wantErr: "bad duration"},
		{name: "empty binary", in: "[qemu]\nbinary = \"\"\n", wantErr: "qemu.binary is empty"},
		{name: "wrong type", in: "[restore]\nstrict = \"yes\"\n", wantErr: "line 2 column 10"},
		{name: "hook timeout", in: "[shim]\nhook_timeout = \"5s\"\n", check: func(t *testing.T, c Config) {
			if c.Shim.HookTimeout.D() != 5*time.Second || Default().Shim.HookTimeout.D() != time.Minute {
				t.Errorf("shim.hook_timeout %v (default %v), want 5s (default 1m)", c.Shim.HookTimeout.D(), Default().Shim.HookTimeout.D())
			}
		}},
		{name: "base images", in: "[restore]\nbase_images = [\"base:512m\", \"base:2g\"]\n", check: func(t *testing.T, c Config) {
			if got := c.Restore.Bases(); len(got) != 2 || got[0] != "base:512m" || got[1] != "base:2g" {
				t.Errorf("bases %v, want base:512m and base:2g", got)
			}
		}},
		{name: "one base image", in: "[restore]\nbase_image = \"base:512m\"\n", check: func(t *testing.T, c Config) {
			if got := c.Restore.Bases(); len(got) != 1 || got[0] != "base:512m" {
				t.Errorf("bases %v, want base:512m", got)
			}
		}},
		{name: "base image and images", in: "[restore]\nbase_image = \"a\"\nbase_images = [\"b\"]\n", wantErr: "are both set: want one of them"},
		{name: "empty base image", in: "[restore]\nbase_images = [\"b\", \"\"]\n", wantErr: "none empty"},
		{name: "zero hook timeout", in: "[shim]\nhook_timeout = \"0s\"\n", wantErr: "shim.hook_timeout must be positive"},
		{name: "hook timeout over a day", in: "[shim]\nhook_timeout = \"25h\"\n", wantErr: "shim.hook_timeout = 25h0m0s: want at most 24h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

// TestParseOver: what the data sets wins over the base, the rest keeps
// the base's values rather than the defaults.
func TestParseOver(t *testing.T) {
	base := Default()
	base.Shim.PooledVM, base.Shim.Spares = false, 4
	tests := []struct {
		in         string
		wantPooled bool
		wantSpares int
	}{
		{in: "", wantPooled: false, wantSpares: 4},
		{in: "[shim]\npooled_vm = true\n", wantPooled: true, wantSpares: 4},
		{in: "[shim]\nspares = 2\n", wantPooled: false, wantSpares: 2},
	}
	for _, tt := range tests {
		c, err := ParseOver(base, []byte(tt.in))
		if err != nil {
			t.Fatalf("%q: %v", tt.in, err)
		}
		if c.Shim.PooledVM != tt.wantPooled || c.Shim.Spares != tt.wantSpares {
			t.Errorf("%q: pooled_vm %v, spares %d; want %v, %d", tt.in, c.Shim.PooledVM, c.Shim.Spares, tt.wantPooled, tt.wantSpares)
		}
	}
	if _, err := ParseOver(base, []byte("[shim]\nspares = 0\n")); err == nil {
		t.Error("a bad value over a base parsed")
	}
}

func TestExampleParses(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config.toml.example"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatalf("config.toml.example: %v", err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("config.toml.example differs from the built-in defaults:\n got %+v\nwant %+v", c, Default())
	}
}

func TestResolve(t *testing.T) {
	t.Setenv(EnvPath, "/from/env.toml")
	if p, ok := Resolve("/explicit.toml"); !ok || p != "/explicit.toml" {
		t.Errorf("explicit: got %q %v", p, ok)
	}
	if p, ok := Resolve(""); !ok || p != "/from/env.toml" {
		t.Errorf("env: got %q %v", p, ok)
	}
}

func TestLoadNamesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(p, []byte("bogus = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("error %v does not name %s", err, p)
	}
}
