package chain

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A container whose image is made of ordinary OCI layers (not chain links)
// gets its root filesystem as one read-only filesystem image of the merged
// layer chain, built once per chain per node and staged by hard link under
// the memory file's rules (0444, never rewritten, shared by every container
// of the chain). The snapshotter stages it into the container snapshot's
// dir, next to the overlay's upper and work dirs, which follow containerd's
// overlay snapshotter:
//
//	<dir>/fs           the overlay upperdir
//	<dir>/work         the overlay workdir
//	<dir>/rootfs.img   the image (StagedRootfsImage), a hard link
//	<dir>/rootfs.json  its descriptor (StagedRootfsFile)
//
// The snapshot's mount is the overlay containerd's overlay snapshotter
// returns (lowerdir = the layers, upperdir = <dir>/fs), so the host can
// mount it as usual; a shim finds <dir> as the parent of that upperdir
// (StagedRootfsDir) and opens it with OpenStagedRootfs.
const (
	StagedRootfsImage = "rootfs.img"
	StagedRootfsFile  = "rootfs.json"

	// RootfsErofs is the only image type written today: uncompressed
	// erofs, which every kernel with CONFIG_EROFS_FS mounts.
	RootfsErofs = "erofs"
)

// maxRootfsJSON bounds rootfs.json, as maxLinkJSON bounds link.json.
const maxRootfsJSON = 64 << 10

// StagedRootfs is rootfs.json: what the staged image is.
type StagedRootfs struct {
	Version int `json:"version"`
	// FSType is the image's filesystem type, as mount(8) names it.
	FSType string `json:"fstype"`
	// Size is the image's size in bytes.
	Size int64 `json:"size"`
	// Key names the layer chain on this node: every container of one
	// chain stages the same image, under the same key.
	Key string `json:"key"`
	// Layers is the number of layers merged into the image.
	Layers int `json:"layers"`

	// Dir is the staged dir it was read from.
	Dir string `json:"-"`
}

// ImagePath is the staged image.
func (r *StagedRootfs) ImagePath() string { return filepath.Join(r.Dir, StagedRootfsImage) }

// ImageSize is the staged image's size in bytes, 0 when it cannot be read:
// a guest told the size of the image behind its disk can skip probing the
// disk again, and one told 0 probes it.
func (r *StagedRootfs) ImageSize() uint64 {
	st, err := os.Stat(r.ImagePath())
	if err != nil {
		return 0
	}
	return uint64(st.Size())
}

// WriteStagedRootfs writes dir/rootfs.json for the image already staged at
// dir/rootfs.img, atomically but without fsync: like chain.json, its maker
// re-stages it after a host crash.
func WriteStagedRootfs(dir string, r StagedRootfs) error {
	r.Version = Version
	if err := r.check(); err != nil {
		return fmt.Errorf("write staged rootfs: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write staged rootfs: %w", err)
	}
	return replaceFile(filepath.Join(dir, StagedRootfsFile), append(b, '\n'), 0o644)
}

// OpenStagedRootfs reads dir/rootfs.json and checks it against the staged
// image: a regular file (not a symlink) of the recorded size.
func OpenStagedRootfs(dir string) (*StagedRootfs, error) {
	path := filepath.Join(dir, StagedRootfsFile)
	b, err := readRootfsFile(path)
	if err != nil {
		return nil, fmt.Errorf("open staged rootfs: %w", err)
	}
	var r StagedRootfs
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: parse: %w", path, err)
	}
	if r.Version != Version {
		return nil, fmt.Errorf("%s: unknown format version %d (want %d)", path, r.Version, Version)
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.Dir = dir
	fi, err := os.Lstat(r.ImagePath())
	if err != nil {
		return nil, fmt.Errorf("open staged rootfs: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != r.Size {
		return nil, fmt.Errorf("%s: a %s of %d bytes, want a regular file of %d bytes", r.ImagePath(), fi.Mode().Type(), fi.Size(), r.Size)
	}
	return &r, nil
}

func (r *StagedRootfs) check() error {
	switch {
	case r.FSType != RootfsErofs:
		return fmt.Errorf("fstype %q: want %q", r.FSType, RootfsErofs)
	case r.Size <= 0:
		return fmt.Errorf("size %d: want a positive byte count", r.Size)
	case r.Key == "":
		return fmt.Errorf("no layer chain key")
	case r.Layers < 1:
		return fmt.Errorf("%d layers: want at least 1", r.Layers)
	}
	return nil
}

// StagedRootfsDir returns the staged dir of a container snapshot from its
// overlay mount's options: the parent of the upperdir.
func StagedRootfsDir(overlayOptions []string) (string, error) {
	for _, o := range overlayOptions {
		if upper, ok := strings.CutPrefix(o, "upperdir="); ok {
			if !filepath.IsAbs(upper) {
				return "", fmt.Errorf("overlay upperdir %q: want an absolute path", upper)
			}
			return filepath.Dir(filepath.Clean(upper)), nil
		}
	}
	return "", fmt.Errorf("overlay options %q name no upperdir: not a container snapshot of ordinary layers", overlayOptions)
}

// CreateTemp creates a temp file next to path, named so that IsTemp
// recognises it, for an immutable file built outside this package (a
// rootfs image) and published with PublishUnsynced.
func CreateTemp(path string) (*os.File, error) { return createTemp(path) }

// PublishUnsynced publishes the temp file f at path as FlattenUnsynced
// publishes a memory file: mode 0444 and rename, whole once at path but
// not fsynced, for a cache its owner drops after a host crash. On error f
// is removed.
func PublishUnsynced(f *os.File, path string) error { return rename(f, path, 0o444) }

// readRootfsFile reads rootfs.json without following a symlink or blocking
// on a FIFO, and refuses one over maxRootfsJSON bytes.
func readRootfsFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is a %s, want a regular file", path, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRootfsJSON+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRootfsJSON {
		return nil, fmt.Errorf("%s is over %d bytes", path, maxRootfsJSON)
	}
	return b, nil
}
