package server

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// checkFiles bounds Init's files and checks their paths and modes.
func checkFiles(files []*api.File) ([]*api.File, error) {
	if len(files) > api.MaxFiles {
		return nil, fmt.Errorf("%d files, expected at most %d: %w", len(files), api.MaxFiles, errdefs.ErrInvalidArgument)
	}
	total := 0
	for _, f := range files {
		switch {
		case !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || f.Path == "/":
			return nil, fmt.Errorf("file %q: expected a clean absolute path to a file: %w", f.Path, errdefs.ErrInvalidArgument)
		case len(f.Data) > api.MaxFileSize:
			return nil, fmt.Errorf("file %q: %d bytes, expected at most %d: %w", f.Path, len(f.Data), api.MaxFileSize, errdefs.ErrInvalidArgument)
		case f.Mode&^uint32(fs.ModePerm) != 0:
			return nil, fmt.Errorf("file %q: mode %#o, expected permission bits only: %w", f.Path, f.Mode, errdefs.ErrInvalidArgument)
		}
		total += len(f.Data)
	}
	if total > api.MaxFilesSize {
		return nil, fmt.Errorf("files hold %d bytes, expected at most %d: %w", total, api.MaxFilesSize, errdefs.ErrInvalidArgument)
	}
	return files, nil
}

// writeFiles writes each file to a temporary name beside it and renames it
// into place, so no reader sees half a file; missing directories are made.
func writeFiles(files []*api.File) error {
	for _, f := range files {
		if err := writeFile(f); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(f *api.File) error {
	mode := fs.FileMode(f.Mode)
	if mode == 0 {
		mode = 0o644
	}
	dir := filepath.Dir(f.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	_, err = tmp.Write(f.Data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), f.Path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	return nil
}
