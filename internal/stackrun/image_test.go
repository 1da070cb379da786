package stackrun

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLockCache checks the cache lock excludes another holder (a second
// process baking into the same cache) until it is released.
func TestLockCache(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "snapshots")
	unlock, err := lockCache(cache)
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Open(filepath.Join(cache, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("second lock while the cache is locked: %v, want EWOULDBLOCK", err)
	}
	unlock()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
}
