package chain

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/opencontainers/go-digest"
)

// DefaultPageSize is used when Meta.PageSize is zero.
const DefaultPageSize = 4096

// Meta is what a writer's caller supplies about a link: everything but its
// kind, parent and memory, which the writer derives.
type Meta struct {
	Hypervisor      string
	HypervisorBuild string
	GuestOS         string
	VCPUs           int
	// PageSize is the guest page size; zero means DefaultPageSize.
	PageSize     int64
	HugePages    bool
	SharedMemory bool
	// StateFiles must already be in the output directory.
	StateFiles []string
	// StateMemory is Link.StateMemory.
	StateMemory string
}

func (m Meta) link(kind Kind, memBytes int64, parent *Link) *Link {
	l := &Link{
		Version: Version, Kind: kind,
		Hypervisor: m.Hypervisor, HypervisorBuild: m.HypervisorBuild, GuestOS: m.GuestOS,
		VCPUs: m.VCPUs, MemoryBytes: memBytes, PageSize: m.pageSize(),
		HugePages: m.HugePages, SharedMemory: m.SharedMemory,
		StateFiles: append([]string{}, m.StateFiles...), StateMemory: m.StateMemory,
	}
	if parent != nil {
		l.Parent = parent.id
	}
	return l
}

func (m Meta) pageSize() int64 {
	if m.PageSize == 0 {
		return DefaultPageSize
	}
	return m.PageSize
}

// linkWriter streams a link's memory files into a directory and writes
// link.json last, so a directory holding link.json is complete.
type linkWriter struct {
	dir       string
	extFile   *os.File
	ext       *extentWriter
	dataFile  *os.File
	data      *bufio.Writer
	dataHash  hash.Hash
	dataBytes int64
}

// startLink checks l and outDir (state files present, no link yet) and
// creates the memory files.
func startLink(outDir string, l *Link, parent *Link) (*linkWriter, error) {
	if err := l.checkHeader(); err != nil {
		return nil, fmt.Errorf("write link: %w", err)
	}
	if err := checkParent(l, parent); err != nil {
		return nil, fmt.Errorf("write link: %w", err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("write link: %w", err)
	}
	if err := CheckNoLink(outDir); err != nil {
		return nil, fmt.Errorf("write link: %w", err)
	}
	for _, name := range l.StateFiles {
		if err := checkStateFile(filepath.Join(outDir, name)); err != nil {
			return nil, fmt.Errorf("write link: state file: %w", err)
		}
	}
	w := &linkWriter{dir: outDir, dataHash: digest.SHA256.Hash()}
	var err error
	if w.extFile, err = os.Create(filepath.Join(outDir, ExtentsFile)); err != nil {
		return nil, fmt.Errorf("write link: %w", err)
	}
	if w.dataFile, err = os.Create(filepath.Join(outDir, DataFile)); err != nil {
		w.abort()
		return nil, fmt.Errorf("write link: %w", err)
	}
	w.data = bufio.NewWriterSize(io.MultiWriter(w.dataFile, w.dataHash), ioChunk)
	if w.ext, err = newExtentWriter(w.extFile); err != nil {
		w.abort()
		return nil, fmt.Errorf("write link: %w", err)
	}
	return w, nil
}

// add appends the pages b at off; calls come in increasing offset order.
func (w *linkWriter) add(off int64, b []byte) error {
	if err := w.ext.add(Extent{Offset: off, Length: int64(len(b))}); err != nil {
		return fmt.Errorf("write %s: %w", w.extFile.Name(), err)
	}
	if _, err := w.data.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", w.dataFile.Name(), err)
	}
	w.dataBytes += int64(len(b))
	return nil
}

// finish syncs the memory files, records them in l and writes link.json.
func (w *linkWriter) finish(l *Link) (*Link, error) {
	return w.finishAfter(l, nil)
}

// finishAfter is finish that runs written, if set, once the memory files
// are written and before they are synced.
func (w *linkWriter) finishAfter(l *Link, written func() error) (*Link, error) {
	n, extDigest, err := w.ext.close()
	if err == nil {
		err = w.data.Flush()
	}
	if err == nil && written != nil {
		err = written()
	}
	for _, f := range []*os.File{w.extFile, w.dataFile} {
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		w.abort()
		return nil, fmt.Errorf("write link memory in %s: %w", w.dir, err)
	}
	l.Memory = MemoryInfo{
		Extents: n, DataBytes: w.dataBytes,
		ExtentsDigest: extDigest, DataDigest: digest.NewDigest(digest.SHA256, w.dataHash),
	}
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		w.abort()
		return nil, fmt.Errorf("write link: %w", err)
	}
	b = append(b, '\n')
	if err := writeFileAtomic(filepath.Join(w.dir, LinkFile), b, 0o644); err != nil {
		w.abort()
		return nil, fmt.Errorf("write link: %w", err)
	}
	l.id = digest.FromBytes(b)
	return l, nil
}

// abort removes the memory files of an unfinished link.
func (w *linkWriter) abort() {
	for _, f := range []*os.File{w.extFile, w.dataFile} {
		if f != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}
}

// chunkSize is a whole number of pages near ioChunk.
func chunkSize(pageSize int64) int64 {
	return max(ioChunk/pageSize, 1) * pageSize
}

// CheckNoLink refuses dir if it holds a link already. A snapshot checks it
// before the hypervisor writes any state file into dir, which would
// otherwise overwrite that link's before its memory writer refused.
// A dir that is missing, or no dir at all, holds none: creating it reports that.
func CheckNoLink(dir string) error {
	_, err := os.Lstat(filepath.Join(dir, LinkFile))
	switch {
	case err == nil:
		return fmt.Errorf("%s already holds a link", dir)
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return nil
	}
	return fmt.Errorf("look for a link in %s: %w", dir, err)
}
