package vm

import (
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	units "github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
)

// copyUsage is what copies of host files take in a guest: entries (files,
// directories, links) and bytes of file data.
type copyUsage struct {
	files int
	bytes int64
}

func (u copyUsage) plus(v copyUsage) copyUsage {
	return copyUsage{files: u.files + v.files, bytes: u.bytes + v.bytes}
}

// usageOf is what files take, counting only those under dir when dir is
// not "".
func usageOf(files []agent.File, dir string) copyUsage {
	var u copyUsage
	for _, f := range files {
		if dir != "" && !strings.HasPrefix(f.Path, dir+"/") {
			continue
		}
		u.files++
		if f.Mode&fs.ModeType == 0 {
			u.bytes += int64(len(f.Data))
		}
	}
	return u
}

// copyBudget bounds what one VM's guest holds of copies of host files
// (shim.copy_files and shim.copy_bytes): they live in guest memory, and
// the host reads each into its own first.
type copyBudget struct {
	limit copyUsage

	mu   sync.Mutex
	held copyUsage
}

func newCopyBudget(s config.Shim) *copyBudget {
	return &copyBudget{limit: copyUsage{files: s.CopyFiles, bytes: int64(s.CopyBytes)}}
}

// fits fails unless the guest can hold more besides what it holds.
func (b *copyBudget) fits(more copyUsage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.over(more)
}

// room is the bytes of file data the guest can hold besides what it holds
// and more.
func (b *copyBudget) room(more copyUsage) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(0, b.limit.bytes-b.held.bytes-more.bytes)
}

// take adds more to what the guest holds, or fails, taking nothing.
func (b *copyBudget) take(more copyUsage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.over(more); err != nil {
		return err
	}
	b.held = b.held.plus(more)
	return nil
}

// give takes back what the guest no longer holds.
func (b *copyBudget) give(u copyUsage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held.files -= u.files
	b.held.bytes -= u.bytes
}

// over names what more would take past the bound, and the bound.
func (b *copyBudget) over(more copyUsage) error {
	switch {
	case b.held.files+more.files > b.limit.files:
		return fmt.Errorf("a copy of %d files, directories and links (or more), with the %d the VM's copies hold already, is over shim.copy_files = %d: %w",
			more.files, b.held.files, b.limit.files, errdefs.ErrInvalidArgument)
	case b.held.bytes+more.bytes > b.limit.bytes:
		return fmt.Errorf("a copy of %s of file data (or more), with the %s the VM's copies hold already, is over shim.copy_bytes = %s: %w",
			units.BytesSize(float64(more.bytes)), units.BytesSize(float64(b.held.bytes)), units.BytesSize(float64(b.limit.bytes)), errdefs.ErrInvalidArgument)
	}
	return nil
}
