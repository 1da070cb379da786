// Package guestfile checks and writes the files the host sends the guest
// (the copies of bind sources, a container's own files): bounded, clean
// absolute paths, regular files, directories and links only.
package guestfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// Check bounds the files of one request (Init's, a container's) and
// checks their paths, types and modes: a file, a directory (no data) or
// a symbolic link (its target as data).
func Check(files []*api.File) ([]*api.File, error) {
	return check(files, false)
}

// CheckPieces is Check for a request that may carry regular files in
// pieces (UpdateFiles').
func CheckPieces(files []*api.File) ([]*api.File, error) {
	return check(files, true)
}

func check(files []*api.File, pieces bool) ([]*api.File, error) {
	if len(files) > api.MaxFiles {
		return nil, fmt.Errorf("%d files, expected at most %d: %w", len(files), api.MaxFiles, errdefs.ErrInvalidArgument)
	}
	total := 0
	links := map[string]bool{}
	for _, f := range files {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("file %q: expected a clean absolute path to a file: %w", f.Path, errdefs.ErrInvalidArgument)
		}
		if err := checkOne(f); err != nil {
			return nil, fmt.Errorf("file %q: %w", f.Path, err)
		}
		if err := checkPiece(f, pieces); err != nil {
			return nil, fmt.Errorf("file %q: %w", f.Path, err)
		}
		if f.Mode&unix.S_IFMT == unix.S_IFLNK {
			links[f.Path] = true
		}
		total += len(f.Data)
	}
	if total > api.MaxFilesSize {
		return nil, fmt.Errorf("files hold %d bytes, expected at most %d: %w", total, api.MaxFilesSize, errdefs.ErrInvalidArgument)
	}
	return files, checkUnderLinks(files, links)
}

func checkOne(f *api.File) error {
	kind := f.Mode & unix.S_IFMT
	switch {
	case f.Mode&^uint32(unix.S_IFMT|fs.ModePerm) != 0:
		return fmt.Errorf("mode %#o, expected a type and permission bits only: %w", f.Mode, errdefs.ErrInvalidArgument)
	case f.TmpfsSize > 0 && kind != unix.S_IFDIR:
		return fmt.Errorf("a tmpfs of %d bytes on mode %#o, expected a directory's mode: %w", f.TmpfsSize, f.Mode, errdefs.ErrInvalidArgument)
	case kind == 0:
		if len(f.Data) > api.MaxFileSize {
			return fmt.Errorf("%d bytes, expected at most %d: %w", len(f.Data), api.MaxFileSize, errdefs.ErrInvalidArgument)
		}
	case kind == unix.S_IFDIR:
		if len(f.Data) > 0 {
			return fmt.Errorf("a directory with %d bytes of data, expected none: %w", len(f.Data), errdefs.ErrInvalidArgument)
		}
	case kind == unix.S_IFLNK:
		if len(f.Data) == 0 || len(f.Data) >= unix.PathMax || bytes.IndexByte(f.Data, 0) >= 0 {
			return fmt.Errorf("a link to %q, expected a target of 1 to %d bytes without NUL: %w", f.Data, unix.PathMax-1, errdefs.ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("mode %#o, expected a file, a directory (%#o) or a link (%#o): %w", f.Mode, unix.S_IFDIR, unix.S_IFLNK, errdefs.ErrInvalidArgument)
	}
	return nil
}

// checkPiece checks a piece of a file sent in pieces: a regular file's,
// within MaxPiecedFile, where pieces are taken.
func checkPiece(f *api.File, pieces bool) error {
	switch {
	case f.Offset == 0 && !f.More:
		return nil
	case !pieces:
		return fmt.Errorf("a piece of a file (offset %d), expected a whole file: only UpdateFiles takes files in pieces: %w", f.Offset, errdefs.ErrInvalidArgument)
	case f.Mode&unix.S_IFMT != 0:
		return fmt.Errorf("a piece (offset %d) of mode %#o, expected a regular file's: %w", f.Offset, f.Mode, errdefs.ErrInvalidArgument)
	case f.Offset > api.MaxPiecedFile-uint64(len(f.Data)):
		return fmt.Errorf("a piece ending at %d bytes, expected a file of at most %d: %w", f.Offset+uint64(len(f.Data)), api.MaxPiecedFile, errdefs.ErrInvalidArgument)
	}
	return nil
}

// checkUnderLinks refuses a file under a link the same request makes: the
// guest would write where the link points, outside what the host meant.
func checkUnderLinks(files []*api.File, links map[string]bool) error {
	if len(links) == 0 {
		return nil
	}
	for _, f := range files {
		for d := filepath.Dir(f.Path); d != "/"; d = filepath.Dir(d) {
			if links[d] {
				return fmt.Errorf("file %q: under %q, a link made by the same request: %w", f.Path, d, errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// Write makes each file, directory and link; missing parent
// directories are made 0755.
func Write(files []*api.File) error {
	for _, f := range files {
		var err error
		switch f.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			err = writeDir(f.Path, fs.FileMode(f.Mode).Perm())
			if err == nil && f.TmpfsSize > 0 {
				err = mountTmpfs(f.Path, f.TmpfsSize, fs.FileMode(f.Mode).Perm())
			}
		case unix.S_IFLNK:
			err = writeLink(f.Path, string(f.Data))
		default:
			err = writeRegular(f)
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	return nil
}

// writeDir makes a directory with exactly perm (no umask), or gives an
// existing one perm.
func writeDir(path string, perm fs.FileMode) error {
	if perm == 0 {
		perm = 0o755
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(path, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if fi, err := os.Lstat(path); err != nil || !fi.IsDir() {
		return fmt.Errorf("not a directory: %w", fs.ErrExist)
	}
	return os.Chmod(path, perm)
}

// writeLink makes a link to target, replacing a link already there in one
// rename: a reader resolving it finds the old target or the new one (a
// Kubernetes volume's ..data link swaps its whole set of files so).
func writeLink(path, target string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("not a link: %w", fs.ErrExist)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".link")
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// Beneath fails unless path is strictly under root with no link between
// the two: a write or removal there stays under root.
func Beneath(root, path string) error {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return fmt.Errorf("%q: expected a clean path under %s: %w", path, root, errdefs.ErrInvalidArgument)
	}
	for d := filepath.Dir(path); d != root && d != "/"; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%q: %w", path, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%q: under %s, a link: %w", path, d, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// WriteFile writes f to a temporary name beside it and renames it into
// place, so no reader sees half a file.
func WriteFile(f *api.File) error {
	mode := fs.FileMode(f.Mode)
	if mode == 0 {
		mode = 0o644
	}
	dir := filepath.Dir(f.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return err
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
		return err
	}
	return nil
}

func writeRegular(f *api.File) error {
	if f.Offset != 0 || f.More {
		return writePiece(f)
	}
	return WriteFile(f)
}

// writePiece writes a piece of a file sent in pieces into the file beside
// it that gathers them, which the first piece makes anew; the last piece
// gives it its mode and renames it into place, so no reader sees part of
// the file.
func writePiece(f *api.File) error {
	gather := filepath.Join(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".pieces")
	flags := os.O_WRONLY | os.O_APPEND | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if f.Offset == 0 {
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
			return err
		}
		flags |= os.O_CREATE | os.O_TRUNC
	}
	w, err := os.OpenFile(gather, flags, 0o600)
	if err != nil {
		return fmt.Errorf("piece at offset %d: %w", f.Offset, err)
	}
	err = appendPiece(w, f)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err == nil && !f.More {
		err = os.Rename(gather, f.Path)
	}
	if err != nil {
		os.Remove(gather)
	}
	return err
}

// appendPiece appends f's piece to w, which must hold the pieces before
// it, and on the last piece gives w f's mode.
func appendPiece(w *os.File, f *api.File) error {
	st, err := w.Stat()
	if err != nil {
		return err
	}
	if uint64(st.Size()) != f.Offset {
		return fmt.Errorf("piece at offset %d, expected %d, the size of the pieces before it: %w", f.Offset, st.Size(), errdefs.ErrInvalidArgument)
	}
	if _, err := w.Write(f.Data); err != nil || f.More {
		return err
	}
	mode := fs.FileMode(f.Mode)
	if mode == 0 {
		mode = 0o644
	}
	return w.Chmod(mode)
}
