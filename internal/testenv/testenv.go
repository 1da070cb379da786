// Package testenv lets tests that need root, QEMU, a guest build or
// containerd find them, and refuse loudly when they are missing.
//
// Outside CI a missing prerequisite skips the test with a message naming it
// and the command that provides it; under CI=true it fails the test, so a
// tier can never pass by not running.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// Unavailable stops t because what is missing. In the unit tier (go test
// -short, `make unit`) it skips: that tier runs only pure logic. Under
// CI=true it fails the test; elsewhere it skips with the reason printed.
func Unavailable(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("UNIT TIER: not run: %s", what)
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("REQUIRED IN CI: %s", what)
	}
	t.Skipf("NOT RUN: %s (run `make test` to install it)", what)
}

// RequireRoot stops t unless it runs as root; in the unit tier always,
// since a test that needs root needs the machine.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		Unavailable(t, "this test needs root")
	}
}

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Bin returns the path of a binary built into the repository's bin/
// directory (make build), or stops t.
func Bin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(), "bin", name)
	if _, err := os.Stat(p); err != nil || testing.Short() {
		Unavailable(t, "bin/"+name+" is not built (make build)")
	}
	return p
}

// Guest returns the guest build directory (make guest), or stops t.
func Guest(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("COCOON_GUEST_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "build", "guest")
	}
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil || testing.Short() {
			Unavailable(t, "guest build missing "+f+" in "+dir+" (make guest)")
		}
	}
	return dir
}

// LookPath returns the path of an installed program, or stops t.
func LookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, name+" is not installed")
	}
	return p
}

// QEMU returns the qemu-system-x86_64 binary, or stops t.
func QEMU(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	return LookPath(t, "qemu-system-x86_64")
}

// Eventually waits until check succeeds, looking again with a growing pause
// (1 ms up to 200 ms), and fails t with check's last error once within has
// passed. It is for what a test cannot be told of — another process's
// state, a file a daemon writes — not for timing.
func Eventually(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(pause)
	}
}
