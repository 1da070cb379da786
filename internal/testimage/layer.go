package testimage

import (
	"archive/tar"
	"bytes"
	"cmp"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"
)

// Entry is one file system entry of a layer: a regular file, a directory,
// a symlink or a hard link.
type Entry struct {
	// Path inside the image, e.g. "bin/sh"; a leading slash is ignored.
	Path string
	// Mode is the permission bits, plus fs.ModeDir for a directory or
	// fs.ModeSymlink for a symlink; a regular file otherwise.
	Mode fs.FileMode
	// Data is a regular file's content.
	Data []byte
	// Target is a symlink's target.
	Target string
	// Link is a hard link's target: another regular file of the layer.
	Link     string
	UID, GID int
}

// File is a regular file owned by root; perm may carry fs.ModeSetuid,
// fs.ModeSetgid and fs.ModeSticky.
func File(p string, perm fs.FileMode, data []byte) Entry {
	return Entry{Path: p, Mode: perm &^ fs.ModeType, Data: data}
}

// Dir is a directory owned by root; perm may carry fs.ModeSticky.
func Dir(p string, perm fs.FileMode) Entry {
	return Entry{Path: p, Mode: fs.ModeDir | perm&^fs.ModeType}
}

// Symlink is a symlink at p pointing to target.
func Symlink(p, target string) Entry {
	return Entry{Path: p, Mode: fs.ModeSymlink | 0o777, Target: target}
}

// Hardlink is a hard link at p to target, a regular file of the same
// layer (as the busybox image links its applets).
func Hardlink(p, target string) Entry {
	return Entry{Path: p, Link: strings.TrimPrefix(target, "/")}
}

// Whiteout removes p, and everything below it, inherited from the layers
// below (the OCI ".wh." file).
func Whiteout(p string) Entry {
	dir, base := path.Split(strings.TrimPrefix(p, "/"))
	return Entry{Path: dir + ".wh." + base}
}

// Owned is e owned by uid:gid.
func (e Entry) Owned(uid, gid int) Entry {
	e.UID, e.GID = uid, gid
	return e
}

// Layer is one image layer's entries, in any order; missing parent
// directories are added (0755, root).
type Layer []Entry

// epoch is every entry's mtime, so a layer always tars to the same digest.
var epoch = time.Unix(0, 0).UTC()

// Tar returns the layer as an uncompressed tar, entries sorted by path so
// parents come before their children, hard links last so their targets
// come before them.
func (l Layer) Tar() ([]byte, error) {
	entries, err := l.complete()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := writeEntry(tw, e); err != nil {
			return nil, fmt.Errorf("tar %s: %w", e.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar layer: %w", err)
	}
	return buf.Bytes(), nil
}

// complete cleans the entries' paths, rejects duplicates and paths that
// leave the root, adds missing parent directories and sorts by path.
func (l Layer) complete() ([]Entry, error) {
	byPath := map[string]Entry{}
	for _, e := range l {
		p := path.Clean(strings.TrimPrefix(e.Path, "/"))
		if p == "." || p == ".." || strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("entry path %q: want a path inside the image", e.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("entry path %q given twice", e.Path)
		}
		e.Path = p
		byPath[p] = e
	}
	for p := range byPath {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if _, ok := byPath[dir]; !ok {
				byPath[dir] = Dir(dir, 0o755)
			}
		}
	}
	entries := make([]Entry, 0, len(byPath))
	for _, e := range byPath {
		if e.Link != "" {
			t, ok := byPath[e.Link]
			if !ok || !t.Mode.IsRegular() || t.Link != "" {
				return nil, fmt.Errorf("hard link %s: target %q: want a regular file of the layer", e.Path, e.Link)
			}
			// An unpacker applies a link's mode and owner to the inode it
			// shares: they must be the target's.
			e.Mode, e.UID, e.GID = t.Mode, t.UID, t.GID
			entries = append(entries, e)
			continue
		}
		if e.Mode.IsDir() || e.Mode&fs.ModeSymlink != 0 || e.Mode.IsRegular() {
			entries = append(entries, e)
			continue
		}
		return nil, fmt.Errorf("entry %s: mode %s: want a regular file, a directory or a symlink", e.Path, e.Mode)
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(linkRank(a), linkRank(b)), strings.Compare(a.Path, b.Path))
	})
	return entries, nil
}

// linkRank sorts hard links after every other entry.
func linkRank(e Entry) int {
	if e.Link != "" {
		return 1
	}
	return 0
}

func writeEntry(tw *tar.Writer, e Entry) error {
	hdr := &tar.Header{
		Name: e.Path, Mode: tarMode(e.Mode), Uid: e.UID, Gid: e.GID,
		ModTime: epoch, Format: tar.FormatPAX,
	}
	switch {
	case e.Link != "":
		hdr.Typeflag, hdr.Linkname = tar.TypeLink, e.Link
	case e.Mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.Path+"/"
	case e.Mode&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
	default:
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.Data))
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := tw.Write(e.Data)
	return err
}

// tarMode is m's permission and special bits as tar (and chmod) spell them.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	for bit, v := range map[fs.FileMode]int64{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000} {
		if m&bit != 0 {
			mode |= v
		}
	}
	return mode
}
