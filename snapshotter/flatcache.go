package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/moby/locker"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

type flattenFunc func(ctx context.Context, linkDirs []string, outPath string) error

type removeFunc func(path string) error

// buildFunc publishes a cache file at out: a temp file, 0444, rename; no
// fsync, as the cache is dropped after a host crash (dropAll).
type buildFunc func(ctx context.Context, out string) error

// flatCache holds the files staged by hard link: one flattened memory file
// per chain of links, named by the top link's ID (which pins every ancestor
// through the parent digests), and one filesystem image per chain of
// ordinary layers (rootfsCacheName). Files are immutable once published; a
// staged hard link pins one (nlink > 1). Nothing here drops their page
// cache (POSIX_FADV_DONTNEED): it is shared by every VM using the file.
type flatCache struct {
	dir    string
	budget int64 // allocated bytes; 0 = unlimited
	remove removeFunc

	locks   *locker.Locker // per file: build, stage and remove
	evictor evictor

	mu      sync.Mutex
	entries map[string]*flatEntry
}

type flatEntry struct {
	size   int64 // allocated bytes
	used   time.Time
	orphan bool // its top snapshot is gone: remove once unpinned, whatever the budget
}

// openFlatCache removes temp files a crashed build left and indexes the
// published files, least recently used first by their mtime (touched on use).
func openFlatCache(dir string, budget int64, remove removeFunc) (*flatCache, error) {
	c := &flatCache{
		dir: dir, budget: budget, remove: remove,
		locks: locker.New(), evictor: newEvictor(), entries: map[string]*flatEntry{},
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read flat cache: %w", err)
	}
	ctx := context.Background()
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if chain.IsTemp(de.Name()) {
			log.G(ctx).WithField("path", p).Info("removing half-built flat file")
			if err := os.Remove(p); err != nil {
				return nil, fmt.Errorf("remove half-built flat file: %w", err)
			}
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("index flat cache: %w", err)
		}
		if !fi.Mode().IsRegular() {
			log.G(ctx).WithField("path", p).Warn("ignoring non-regular file in flat cache")
			continue
		}
		c.entries[de.Name()] = &flatEntry{size: allocated(fi), used: fi.ModTime()}
	}
	return c, nil
}

// stage makes dst a hard link of the cache file name, building it first if
// no file exists. The per-file lock makes concurrent stages of one chain
// build once, and keeps eviction off the file until dst pins it. Eviction
// runs later, in the background: dst is usable before any file is unlinked.
func (c *flatCache) stage(ctx context.Context, name string, build buildFunc, dst string) error {
	path := filepath.Join(c.dir, name)
	c.locks.Lock(name)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		fi, err = c.build(ctx, build, path)
	}
	if err == nil {
		err = linkOrCopy(ctx, path, dst)
	}
	if err == nil {
		c.touch(path, fi)
	}
	c.locks.Unlock(name)
	if err != nil {
		return err
	}
	c.requestEvict()
	return nil
}

// has reports whether the cache file name exists now: a hint, since it
// may be evicted before it is staged (stage then builds it again).
func (c *flatCache) has(name string) bool {
	_, err := os.Stat(filepath.Join(c.dir, name))
	return err == nil
}

func (c *flatCache) build(ctx context.Context, build buildFunc, path string) (os.FileInfo, error) {
	start := time.Now()
	// Waiters on the lock share this build: one cancelled request must
	// not throw away work the others wait for.
	if err := build(context.WithoutCancel(ctx), path); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("stat built file: %w", err)
	}
	log.G(ctx).WithFields(log.Fields{
		"path": path, "bytes": fi.Size(), "allocated": allocated(fi), "duration": time.Since(start),
	}).Info("built flat file")
	return fi, nil
}

// touch records a use, in memory and as the file's times so that the LRU
// order survives a restart. Times are metadata: the bytes stay immutable.
// A use never revives an orphan: a stage racing the removal of its chain's
// top snapshot must not keep the file past the eviction pass.
func (c *flatCache) touch(path string, fi os.FileInfo) {
	now := time.Now()
	_ = os.Chtimes(path, now, now)
	name := filepath.Base(path)
	c.mu.Lock()
	orphan := c.entries[name] != nil && c.entries[name].orphan
	c.entries[name] = &flatEntry{size: allocated(fi), used: now, orphan: orphan}
	c.mu.Unlock()
}

// drop marks the flat file of a chain whose top snapshot is gone for removal
// by the next eviction pass, once no staged dir pins it: unlinking a large
// file can take seconds, which Remove should not wait for.
func (c *flatCache) drop(names ...string) {
	c.mu.Lock()
	for _, name := range names {
		if e, ok := c.entries[name]; ok {
			e.orphan = true
		}
	}
	c.mu.Unlock()
	c.requestEvict()
}

// removeUnpinned removes the named file if no hard link pins it and returns
// the bytes freed. The caller holds the name's lock.
func (c *flatCache) removeUnpinned(name string) (int64, error) {
	path := filepath.Join(c.dir, name)
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		c.forget(name)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		return 0, nil
	}
	if err := c.remove(path); err != nil {
		return 0, err
	}
	c.forget(name)
	return allocated(fi), nil
}

func (c *flatCache) forget(name string) {
	c.mu.Lock()
	delete(c.entries, name)
	c.mu.Unlock()
}

// allocated is the bytes a (sparse) file really occupies on disk.
func allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// dropAll removes every cache file, pinned or not, before anything uses
// the cache: after a host crash, which may have torn any of them (they are
// not fsynced), every staged dir is staged again from a new one.
func (c *flatCache) dropAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.entries {
		if err := c.remove(filepath.Join(c.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("drop flat cache file after a reboot: %w", err)
		}
		delete(c.entries, name)
	}
	return nil
}
