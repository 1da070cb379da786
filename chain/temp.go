package chain

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tempPrefix starts the name of every file this package writes before
// publishing it by rename, so a crash leaves only names IsTemp recognises.
const tempPrefix = ".tmp-"

// IsTemp reports whether the base of name is a temp file of this package
// (or of a user following its convention); such files are safe to remove
// when nothing is writing them, e.g. on a restart after a crash.
func IsTemp(name string) bool {
	return strings.HasPrefix(filepath.Base(name), tempPrefix)
}

// createTemp creates a temp file next to path, with a name IsTemp accepts.
func createTemp(path string) (*os.File, error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return nil, fmt.Errorf("create temp file for %s: %w", path, err)
	}
	return f, nil
}

// publish fsyncs and closes the temp file f, sets its mode, renames it to
// path and fsyncs the directory. On error the temp file is removed.
func publish(f *os.File, path string, perm os.FileMode) error {
	if err := f.Sync(); err != nil {
		discard(f)
		return fmt.Errorf("publish %s: %w", path, err)
	}
	if err := rename(f, path, perm); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// rename closes the temp file f, sets its mode and renames it to path:
// atomic, so readers see the old file or the whole new one, but not durable.
// On error the temp file is removed.
func rename(f *os.File, path string, perm os.FileMode) error {
	err := f.Chmod(perm)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("publish %s: %w", path, err)
	}
	return nil
}

// discard closes and removes an unpublished temp file.
func discard(f *os.File) {
	f.Close()
	os.Remove(f.Name())
}

// writeFileAtomic writes data to path by temp file, fsync and rename.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	return writeFileVia(path, data, perm, publish)
}

// replaceFile writes data to path by temp file and rename, without fsync:
// for files whose loss in a host crash their writer recovers from.
func replaceFile(path string, data []byte, perm os.FileMode) error {
	return writeFileVia(path, data, perm, rename)
}

func writeFileVia(path string, data []byte, perm os.FileMode, put func(*os.File, string, os.FileMode) error) error {
	f, err := createTemp(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		discard(f)
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	return put(f, path, perm)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
