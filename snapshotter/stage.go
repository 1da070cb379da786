package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// stageLinks fills dir with the chain of links lc: memory (a hard link of
// the chain's flat file), private copies of the top link's state files (the
// shim patches them) and chain.json. It returns the flat file's name once
// known, even on error.
func (s *Snapshotter) stageLinks(ctx context.Context, lc layerChain, dir string) (string, error) {
	dirs := s.linkDirs(lc)
	links := make([]*chain.Link, len(dirs))
	var err error
	for i, d := range dirs {
		if links[i], err = chain.ReadLink(d); err != nil {
			return "", fmt.Errorf("read link: %w", err)
		}
	}
	top, topDir := links[len(links)-1], dirs[len(dirs)-1]
	flatten := func(ctx context.Context, out string) error {
		if err := s.flatten(ctx, dirs, out); err != nil {
			return fmt.Errorf("flatten chain of %d links: %w", len(dirs), err)
		}
		return nil
	}
	name := top.ID().Encoded()
	if err := s.flat.stage(ctx, name, flatten, filepath.Join(dir, chain.StagedMemory)); err != nil {
		return name, err
	}
	for _, file := range top.StateFiles {
		if file != filepath.Base(file) || file == chain.StagedMemory || file == chain.StagedChain {
			return name, fmt.Errorf("link %s: state file name %q: want a plain file name other than %s and %s",
				topDir, file, chain.StagedMemory, chain.StagedChain)
		}
		// A private copy: the shim patches these files for its VM.
		if err := chain.CopyStateFile(filepath.Join(topDir, file), filepath.Join(dir, file)); err != nil {
			return name, fmt.Errorf("copy state file %s: %w", file, err)
		}
	}
	if err := chain.WriteStaged(dir, links); err != nil {
		return name, fmt.Errorf("write %s: %w", chain.StagedChain, err)
	}
	return name, nil
}

// stageRootfs puts into dir (a container snapshot on the ordinary layers lc)
// the chain's filesystem image, a hard link, and its descriptor. It returns
// the image's name in the flat cache, even on error.
func (s *Snapshotter) stageRootfs(ctx context.Context, lc layerChain, dir string) (string, error) {
	name := lc.rootfsName()
	layers := s.layerDirs(lc.ids)
	build := func(ctx context.Context, out string) error { return s.buildImage(ctx, layers, out) }
	img := filepath.Join(dir, chain.StagedRootfsImage)
	if err := s.flat.stage(ctx, name, build, img); err != nil {
		return name, err
	}
	fi, err := os.Stat(img)
	if err != nil {
		return name, fmt.Errorf("stat staged rootfs image: %w", err)
	}
	r := chain.StagedRootfs{FSType: chain.RootfsErofs, Size: fi.Size(), Key: name, Layers: len(layers)}
	if err := chain.WriteStagedRootfs(dir, r); err != nil {
		return name, fmt.Errorf("write %s: %w", chain.StagedRootfsFile, err)
	}
	return name, nil
}

// unstageRootfs removes the staged image and its descriptor from dir.
func unstageRootfs(dir string) error {
	for _, name := range []string{chain.StagedRootfsFile, chain.StagedRootfsImage} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("unstage rootfs: %w", err)
		}
	}
	return nil
}
