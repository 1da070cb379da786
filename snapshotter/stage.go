package snapshotter

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// stage fills dir with the chain ending at the committed snapshot parent:
// memory (a hard link of the chain's flat file), private copies of the top
// link's state files (the shim patches them) and chain.json.
func (s *Snapshotter) stage(ctx context.Context, parent, dir string) error {
	dirs, err := s.chainDirs(ctx, parent)
	if err != nil {
		return err
	}
	links := make([]*chain.Link, len(dirs))
	for i, d := range dirs {
		if links[i], err = chain.ReadLink(d); err != nil {
			return fmt.Errorf("read link: %w", err)
		}
	}
	top, topDir := links[len(links)-1], dirs[len(dirs)-1]
	if err := s.flat.stage(ctx, dirs, top.ID(), filepath.Join(dir, chain.StagedMemory)); err != nil {
		return err
	}
	for _, name := range top.StateFiles {
		if name != filepath.Base(name) || name == chain.StagedMemory || name == chain.StagedChain {
			return fmt.Errorf("link %s: state file name %q: want a plain file name other than %s and %s",
				topDir, name, chain.StagedMemory, chain.StagedChain)
		}
		if err := copyPrivate(filepath.Join(topDir, name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	if err := chain.WriteStaged(dir, links); err != nil {
		return fmt.Errorf("write %s: %w", chain.StagedChain, err)
	}
	return nil
}

// copyPrivate copies a small file into a new writable file.
func copyPrivate(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy state file: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("copy state file: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy state file %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copy state file %s: %w", src, err)
	}
	return nil
}
