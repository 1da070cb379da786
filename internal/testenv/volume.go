package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteVolumeVersion does to dir what kubelet's atomic writer does to a
// ConfigMap, Secret or projected volume to make data its content: a new
// directory named version (kubelet's are "..YYYY_MM_DD_…") with the keys'
// files, the ..data link renamed over to it, a link per key through
// ..data, links of keys gone removed, and the old version removed.
func WriteVolumeVersion(t testing.TB, dir, version string, data map[string]string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, version, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := data[e.Name()]; !ok && !strings.HasPrefix(e.Name(), "..") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k := range data {
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	if old != "" && old != version {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}
