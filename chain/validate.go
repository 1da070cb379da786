package chain

import (
	"fmt"
	"path/filepath"
)

// Validate checks a link directory completely except for the data digest,
// which Flatten verifies while it streams: link.json, its place after parent
// (nil for the first link of a chain), the state files, the extents (digest,
// count, layout) and the size of memory.data.
func Validate(dir string, parent *Link) (*Link, error) {
	l, err := ReadLink(dir)
	if err != nil {
		return nil, err
	}
	if err := checkParent(l, parent); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, LinkFile), err)
	}
	if err := checkFiles(dir, l); err != nil {
		return nil, err
	}
	return l, nil
}

// ValidateDir checks a link directory on its own, as Validate does but
// without its place in a chain (for inspecting a single link).
func ValidateDir(dir string) (*Link, error) {
	l, err := ReadLink(dir)
	if err != nil {
		return nil, err
	}
	if err := checkFiles(dir, l); err != nil {
		return nil, err
	}
	return l, nil
}

// checkFiles checks the state and memory files of the link l in dir.
func checkFiles(dir string, l *Link) error {
	for _, name := range l.StateFiles {
		if err := checkStateFile(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("state file: %w", err)
		}
	}
	return checkMemory(dir, l)
}

// checkMemory checks memory.extents against the link and memory.data's size.
func checkMemory(dir string, l *Link) error {
	path := filepath.Join(dir, ExtentsFile)
	c := extentChecker{memBytes: l.MemoryBytes, pageSize: l.PageSize}
	n, dgst, err := readExtents(path, maxExtentsSize(l.MemoryBytes, l.PageSize), c.check)
	if err != nil {
		return err
	}
	switch {
	case dgst != l.Memory.ExtentsDigest:
		return fmt.Errorf("%s: digest %s does not match %s in %s", path, dgst, l.Memory.ExtentsDigest, LinkFile)
	case n != l.Memory.Extents:
		return fmt.Errorf("%s: %d extents, %s says %d", path, n, LinkFile, l.Memory.Extents)
	case c.sum != l.Memory.DataBytes:
		return fmt.Errorf("%s: extents cover %d bytes, %s says %d data bytes", path, c.sum, LinkFile, l.Memory.DataBytes)
	}
	data := filepath.Join(dir, DataFile)
	f, err := OpenLinkFile(data, l.MemoryBytes)
	if err != nil {
		return fmt.Errorf("memory data: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("memory data: %w", err)
	}
	if fi.Size() != c.sum {
		return fmt.Errorf("%s: %d bytes, the extents cover %d", data, fi.Size(), c.sum)
	}
	return nil
}

// checkStateFile checks that path is a state file OpenLinkFile accepts.
func checkStateFile(path string) error {
	f, err := OpenLinkFile(path, MaxStateFile)
	if err != nil {
		return err
	}
	return f.Close()
}

// ValidateChain validates link dirs, oldest first, as one chain.
func ValidateChain(linkDirs []string) ([]*Link, error) {
	if len(linkDirs) == 0 {
		return nil, fmt.Errorf("validate chain: no links")
	}
	links := make([]*Link, 0, len(linkDirs))
	var parent *Link
	for _, dir := range linkDirs {
		l, err := Validate(dir, parent)
		if err != nil {
			return nil, err
		}
		links = append(links, l)
		parent = l
	}
	return links, nil
}
