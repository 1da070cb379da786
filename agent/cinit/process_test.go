package cinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLookPath: the program is found as execvp finds it, with the
// process's own PATH: a file that is not executable or a directory is
// passed over, a path with a slash is taken as it is.
func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{first, second, filepath.Join(first, "dir-prog")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for path, mode := range map[string]os.FileMode{
		filepath.Join(first, "prog"): 0o644, filepath.Join(second, "prog"): 0o755, filepath.Join(second, "dir-prog"): 0o755,
	} {
		if err := os.WriteFile(path, nil, mode); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=/nowhere", "PATH=" + first + ":" + second}
	for _, tc := range []struct {
		prog, want, errHas string
	}{
		{prog: "prog", want: filepath.Join(second, "prog")},
		{prog: "dir-prog", want: filepath.Join(second, "dir-prog")},
		{prog: filepath.Join(second, "prog"), want: filepath.Join(second, "prog")},
		{prog: "missing", errHas: `"missing": executable file not found in $PATH`},
		{prog: filepath.Join(first, "dir-prog"), errHas: "is a directory"},
	} {
		t.Run(tc.prog, func(t *testing.T) {
			got, err := (&Process{Args: []string{tc.prog}, Env: env}).lookPath()
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("lookPath: %q, %v; want an error naming %q", got, err, tc.errHas)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("lookPath: %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestSysctlNames: a sysctl's name is dotted; one that would reach
// outside /proc/sys is refused before anything is written.
func TestSysctlNames(t *testing.T) {
	for _, name := range []string{"../../etc/passwd", "kernel/hostname", "net..ipv4"} {
		if err := setSysctls(map[string]string{name: "x"}); err == nil || !strings.Contains(err.Error(), "expected a dotted name") {
			t.Errorf("sysctl %q: %v, want it refused", name, err)
		}
	}
}
