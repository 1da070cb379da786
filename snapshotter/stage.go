package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/restore/staging"
)

// stageLinks fills dir with the chain of links lc: memory (a hard link of
// a flat file), private copies of the top link's state files (the shim
// patches them) and chain.json. The flat file is the whole chain's, or,
// where staging.Memory says so, that of a prefix flattened earlier, the
// top links' memory files then staged as delta files for the restore to
// write into the guest: a fork of a chain the node has costs its delta,
// not a flatten of the whole memory. It returns the name of the whole
// chain's flat file once staged, even on error ("" for a prefix's, which
// belongs to another snapshot).
func (s *Snapshotter) stageLinks(ctx context.Context, lc layerChain, dir string) (string, error) {
	dirs := s.linkDirs(lc)
	links := make([]*chain.Link, len(dirs))
	var err error
	for i, d := range dirs {
		if links[i], err = chain.ReadLink(d); err != nil {
			return "", fmt.Errorf("read link: %w", err)
		}
	}
	mem := staging.Memory(links, func(i int) bool { return s.flat.has(links[i].ID().Encoded()) })
	k := mem.Covers
	flatten := func(ctx context.Context, out string) error {
		if err := s.flatten(ctx, dirs[:k], out); err != nil {
			return fmt.Errorf("flatten chain of %d links: %w", k, err)
		}
		return nil
	}
	name := links[k-1].ID().Encoded()
	if k < len(links) {
		name = ""
	}
	if err := s.flat.stage(ctx, links[k-1].ID().Encoded(), flatten, filepath.Join(dir, chain.StagedMemory)); err != nil {
		return name, err
	}
	for i := k; i < len(dirs); i++ {
		if err := stageDelta(ctx, dirs[i], dir, i); err != nil {
			return name, err
		}
	}
	if err := stageStateFiles(links[len(links)-1], dirs[len(dirs)-1], dir); err != nil {
		return name, err
	}
	if err := chain.WriteStagedMemory(dir, links, mem); err != nil {
		return name, fmt.Errorf("write %s: %w", chain.StagedChain, err)
	}
	return name, nil
}

// stageDelta stages the memory files of link i (in linkDir), by hard link:
// committed links are immutable, like flat files.
func stageDelta(ctx context.Context, linkDir, dir string, i int) error {
	ext, data := chain.DeltaNames(i)
	for src, dst := range map[string]string{chain.ExtentsFile: ext, chain.DataFile: data} {
		if err := linkOrCopy(ctx, filepath.Join(linkDir, src), filepath.Join(dir, dst)); err != nil {
			return fmt.Errorf("stage link %d's memory: %w", i, err)
		}
	}
	return nil
}

// stageStateFiles copies the top link's state files into dir.
func stageStateFiles(top *chain.Link, topDir, dir string) error {
	for _, file := range top.StateFiles {
		if file != filepath.Base(file) || file == chain.StagedMemory || file == chain.StagedChain {
			return fmt.Errorf("link %s: state file name %q: want a plain file name other than %s and %s",
				topDir, file, chain.StagedMemory, chain.StagedChain)
		}
		// A private copy: the shim patches these files for its VM.
		if err := chain.CopyStateFile(filepath.Join(topDir, file), filepath.Join(dir, file)); err != nil {
			return fmt.Errorf("copy state file %s: %w", file, err)
		}
	}
	return nil
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
