package chain

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"
)

// A staged memory file may hold only the oldest links of the chain: the
// file of a chain prefix that is already flattened on the node. The other
// links' memory files are then staged next to it as delta files, and the
// restore writes their pages into the guest's memory before it runs, which
// costs the size of those links instead of a flatten of the whole memory.

// StagedMemoryInfo is chain.json's "memory": what the staged memory holds.
type StagedMemoryInfo struct {
	// Covers is how many links, oldest first, the memory file holds; the
	// others' memory files are staged as delta files (DeltaPaths). Zero
	// means all of them.
	Covers int `json:"covers,omitempty"`
	// Reason says why the memory was staged so, for restore reports.
	Reason string `json:"reason,omitempty"`
}

func (m StagedMemoryInfo) check(links int) error {
	if m.Covers < 0 || m.Covers > links {
		return fmt.Errorf("memory covers %d links of a chain of %d", m.Covers, links)
	}
	return nil
}

// deltaPrefix starts the staged delta files' names; state files may not
// use it (checkStateFiles).
const deltaPrefix = "memory."

// DeltaNames are the names of the staged memory files of link i (0 is the
// oldest) of a chain: its memory.extents and memory.data.
func DeltaNames(i int) (extents, data string) {
	n := deltaPrefix + "delta" + strconv.Itoa(i)
	return n + ".extents", n + ".data"
}

// Pending are the links whose pages the staged memory file does not hold,
// oldest first: link Memory.Covers+j is Pending()[j].
func (s *Staged) Pending() []*Link { return s.Links[s.Memory.Covers:] }

// DeltaPaths are the staged memory files of link i of the chain.
func (s *Staged) DeltaPaths(i int) (extents, data string) {
	e, d := DeltaNames(i)
	return filepath.Join(s.Dir, e), filepath.Join(s.Dir, d)
}

// ReadPages streams the pages of link l's memory files to fn in extent
// order, a run of whole pages at a time, checking the extents' layout and
// both files' digests against l. The data digest is known only once every
// page has been read: on a mismatch fn has already seen the pages, so fn
// must write only where a failed restore loses nothing (a VM's private
// memory, which the failure throws away).
func ReadPages(ctx context.Context, extentsPath, dataPath string, l *Link, fn func(off int64, data []byte) error) error {
	return readPages(ctx, extentsPath, dataPath, l, bufio.NewReaderSize(nil, ioChunk), fn)
}

// ApplyPending streams the pending links' pages to fn, oldest first and
// each link's in extent order, through one buffer. It checks what ReadPages
// checks but the data digests: the extents' layout and digest, and that
// each data file holds exactly the bytes its extents cover.
//
// Trusting the data is right on the restore path: the staged delta files
// are hard links (or the snapshotter's exact copies) of committed links'
// files, whose data digests the snapshotter verified at Commit
// (VerifyData) before making them read-only, and committed files are never
// written again. The flat file staged next to them is not re-hashed at a
// restore either; hashing the deltas again would cost every restore about
// 4 ms per 8 MiB to guard only against the node's own store going bad.
func (s *Staged) ApplyPending(ctx context.Context, fn func(off int64, data []byte) error) error {
	br := bufio.NewReaderSize(nil, ioChunk)
	for j, l := range s.Pending() {
		i := s.Memory.Covers + j
		ext, data := s.DeltaPaths(i)
		if err := streamPages(ctx, ext, data, l, br, nil, fn); err != nil {
			return fmt.Errorf("link %d of the chain: %w", i+1, err)
		}
	}
	return nil
}

// readPages is ReadPages through br, which flatten reuses across links.
func readPages(ctx context.Context, extentsPath, dataPath string, l *Link, br *bufio.Reader, fn func(off int64, data []byte) error) error {
	return streamPages(ctx, extentsPath, dataPath, l, br, digest.SHA256.Hash(), fn)
}

// streamPages reads link l's pages through br: the data is read in large
// chunks whatever the extents' sizes, and hashed into h (unless nil, which
// skips the data digest check) and handed to fn from br's buffer without a
// copy.
func streamPages(ctx context.Context, extentsPath, dataPath string, l *Link, br *bufio.Reader, h hash.Hash, fn func(off int64, data []byte) error) error {
	data, err := OpenLinkFile(dataPath, l.MemoryBytes)
	if err != nil {
		return fmt.Errorf("read link pages: %w", err)
	}
	defer data.Close()
	br.Reset(data)
	c := extentChecker{memBytes: l.MemoryBytes, pageSize: l.PageSize}
	_, extDigest, err := readExtents(extentsPath, maxExtentsSize(l.MemoryBytes, l.PageSize), func(e Extent) error {
		if err := c.check(e); err != nil {
			return err
		}
		for off := e.Offset; off < e.End(); {
			if err := ctx.Err(); err != nil {
				return err
			}
			b, err := br.Peek(int(min(int64(br.Size()), e.End()-off)))
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s: shorter than its extents", dataPath)
			} else if err != nil {
				return fmt.Errorf("read %s: %w", dataPath, err)
			}
			if h != nil {
				h.Write(b)
			}
			if err := fn(off, b); err != nil {
				return err
			}
			br.Discard(len(b))
			off += int64(len(b))
		}
		return nil
	})
	switch {
	case err != nil:
		return err
	case extDigest != l.Memory.ExtentsDigest:
		return fmt.Errorf("%s: digest %s, %s says %s", extentsPath, extDigest, LinkFile, l.Memory.ExtentsDigest)
	}
	if _, err := br.Peek(1); err != io.EOF {
		return fmt.Errorf("%s: longer than its extents", dataPath)
	}
	if h == nil {
		return nil
	}
	if got := digest.NewDigest(digest.SHA256, h); got != l.Memory.DataDigest {
		return fmt.Errorf("%s: digest mismatch: content is %s, %s says %s", dataPath, got, LinkFile, l.Memory.DataDigest)
	}
	return nil
}

// isDeltaName reports whether name could clash with a staged delta file.
func isDeltaName(name string) bool { return strings.HasPrefix(name, deltaPrefix) }
