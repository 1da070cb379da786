package snapshotter

import (
	"context"
	"fmt"
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
		// A private copy: the shim patches these files for its VM.
		if err := chain.CopyStateFile(filepath.Join(topDir, name), filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("copy state file %s: %w", name, err)
		}
	}
	if err := chain.WriteStaged(dir, links); err != nil {
		return fmt.Errorf("write %s: %w", chain.StagedChain, err)
	}
	return nil
}
