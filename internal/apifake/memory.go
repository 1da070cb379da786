package apifake

import (
	"fmt"
	"io"
	"os"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd/uffdpeer"
)

// guestMemory stands in for a restored VM's RAM: a private copy read
// eagerly (copy restores), an open file read lazily (mapped or on-demand
// restores), which keeps the file's inode in use as a real hypervisor's
// mapping would, or anonymous memory whose pages a userfaultfd handler
// fills (Firecracker's Uffd backend).
type guestMemory struct {
	data []byte
	file *os.File
	anon *uffdpeer.Peer
	// written holds the pages the fake guest wrote, by offset, over any
	// backend: a private overlay, as a copy-on-write mapping keeps them.
	written map[int64][]byte
}

func loadMemory(path string, lazy bool) (*guestMemory, error) {
	if lazy {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("open memory file: %w", err)
		}
		return &guestMemory{file: f}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read memory file: %w", err)
	}
	return &guestMemory{data: data}, nil
}

// writeTo saves the guest memory into a new file at path.
func (m *guestMemory) writeTo(path string) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create memory file: %w", err)
	}
	switch {
	case m.file != nil:
		_, err = io.Copy(out, io.NewSectionReader(m.file, 0, 1<<62))
	case m.anon != nil:
		err = copyAnon(out, m.anon)
	default:
		_, err = out.Write(m.data)
	}
	for off, page := range m.written {
		if err == nil {
			_, err = out.WriteAt(page, off)
		}
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write memory file: %w", err)
	}
	return nil
}

// copyAnon writes anonymous guest memory to w a chunk at a time.
func copyAnon(w io.Writer, mem *uffdpeer.Peer) error {
	buf := make([]byte, 1<<20)
	for off := 0; off < mem.Size(); off += len(buf) {
		chunk := buf[:min(len(buf), mem.Size()-off)]
		if err := mem.Read(off, chunk); err != nil {
			return err
		}
		if _, err := w.Write(chunk); err != nil {
			return err
		}
	}
	return nil
}

// write records the guest writing page at off.
func (m *guestMemory) write(off int64, page []byte) {
	if m.written == nil {
		m.written = map[int64][]byte{}
	}
	m.written[off] = page
}

// read reads the page at off as the guest sees it.
func (m *guestMemory) read(off int64, page []byte) error {
	if w, ok := m.written[off]; ok {
		copy(page, w)
		return nil
	}
	switch {
	case m.file != nil:
		_, err := m.file.ReadAt(page, off)
		return err
	case m.anon != nil:
		return m.anon.Read(int(off), page)
	}
	copy(page, m.data[off:])
	return nil
}

// size is the guest memory's size in bytes.
func (m *guestMemory) size() (int64, error) {
	switch {
	case m.file != nil:
		fi, err := m.file.Stat()
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	case m.anon != nil:
		return int64(m.anon.Size()), nil
	}
	return int64(len(m.data)), nil
}
