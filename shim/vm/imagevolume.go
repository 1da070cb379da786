package vm

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// imageVolume is a bind of an image volume that goes to the guest as a
// disk: the snapshotter's filesystem image of the image, mounted
// read-only at path, which the container's bind then names.
type imageVolume struct {
	image *chain.StagedRootfs
	path  string
}

// stagedImage returns the filesystem image behind bind source src when
// src is the mount of a snapshot the cocoon snapshotter prepared (as
// containerd's CRI mounts an image volume on the host): an overlay whose
// upper dir's parent holds the staged image.
func (b *binds) stagedImage(src string) (*chain.StagedRootfs, bool) {
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return nil, false
	}
	infos, err := b.hostMounts()
	if err != nil {
		return nil, false
	}
	var top *mountinfo.Info // the last mount at real: the one a path walk finds
	for _, mi := range infos {
		if mi.Mountpoint == real {
			top = mi
		}
	}
	if top == nil || top.FSType != "overlay" {
		return nil, false
	}
	dir, err := chain.StagedRootfsDir(strings.Split(top.VFSOptions, ","))
	if err != nil {
		return nil, false
	}
	img, err := chain.OpenStagedRootfs(dir)
	if err != nil {
		return nil, false
	}
	return img, true
}

// imageMount binds image volume img, which the guest mounts under dir.
func (b *binds) imageMount(m specs.Mount, img *chain.StagedRootfs) specs.Mount {
	p := path.Join(b.dir, fmt.Sprintf("image-%d", len(b.images)))
	b.images = append(b.images, imageVolume{image: img, path: p})
	m.Source, m.Type, m.Options = p, "bind", copyOptions(m.Options)
	return m
}

// attachVolumes puts each image volume of container m on a disk slot of
// its own and returns the disks for the guest to mount. The slots are m's
// until its release.
func (p *pod) attachVolumes(ctx context.Context, m *member, images []imageVolume) ([]agent.VolumeDisk, error) {
	var disks []agent.VolumeDisk
	for _, v := range images {
		slot, err := p.claim(m.id)
		if err != nil {
			return nil, fmt.Errorf("image volume at %s: %w", v.path, err)
		}
		m.volumeSlots = append(m.volumeSlots, slot)
		serial, err := p.disks.AttachDisk(ctx, slot, v.image.ImagePath())
		if err != nil {
			return nil, fmt.Errorf("attach image volume %s: %w", v.image.ImagePath(), err)
		}
		disks = append(disks, agent.VolumeDisk{Serial: serial, FSType: v.image.FSType, Path: v.path, Size: v.image.ImageSize()})
	}
	return disks, nil
}
