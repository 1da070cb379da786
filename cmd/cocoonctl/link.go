package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cfs "github.com/containerd/continuity/fs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

func init() {
	register(command{
		name:    "link",
		summary: "make a chain link (full, or a diff against --parent) from a raw memory image",
		flags:   linkFlags,
	})
}

// fileList is a repeatable flag.
type fileList []string

func (l *fileList) String() string     { return strings.Join(*l, ",") }
func (l *fileList) Set(s string) error { *l = append(*l, s); return nil }

type linkOptions struct {
	memory, parentMemory, out string
	parents, state            fileList
	meta                      chain.Meta
}

func linkFlags(fs *flag.FlagSet) action {
	var o linkOptions
	fs.StringVar(&o.memory, "memory", "", "raw guest memory image `file` (required)")
	fs.Var(&o.parents, "parent", "parent chain link `dir`, oldest first; repeat for every link of the parent chain, the last is the direct parent (makes a diff link)")
	fs.StringVar(&o.parentMemory, "parent-memory", "", "the parent chain's flattened memory `file` (default: flatten the --parent links into a temp file)")
	fs.StringVar(&o.out, "out", "", "output link `dir` (required; created if missing)")
	fs.StringVar(&o.meta.Hypervisor, "hypervisor", "", "hypervisor `name` that made the snapshot: "+strings.Join(hypervisor.Names, ", ")+" (required)")
	fs.StringVar(&o.meta.HypervisorBuild, "hypervisor-build", "", "hypervisor build `version` string")
	fs.StringVar(&o.meta.GuestOS, "guest-os", "linux", "guest `os`: linux or windows")
	fs.IntVar(&o.meta.VCPUs, "vcpus", 1, "guest vCPU `count`")
	fs.Int64Var(&o.meta.PageSize, "page-size", chain.DefaultPageSize, "guest page size in `bytes`")
	fs.BoolVar(&o.meta.HugePages, "hugepages", false, "guest memory is backed by huge pages")
	fs.BoolVar(&o.meta.SharedMemory, "shared-memory", false, "guest memory was mapped shared (e.g. QEMU memory-backend-file share=on)")
	fs.Var(&o.state, "state", "hypervisor state `file` to copy into the link (repeatable)")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unexpected arguments %q", args)
		}
		l, err := makeLink(ctx, o)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.out, "%s %s %s: %d extents, %d bytes of memory data\n", o.out, l.Kind, l.ID(), l.Memory.Extents, l.Memory.DataBytes)
		return nil
	}
}

func (o linkOptions) check() error {
	switch {
	case o.memory == "":
		return errors.New("--memory is required")
	case o.out == "":
		return errors.New("--out is required")
	case !slices.Contains(hypervisor.Names, o.meta.Hypervisor):
		return fmt.Errorf("--hypervisor %q: want one of %s", o.meta.Hypervisor, strings.Join(hypervisor.Names, ", "))
	case o.meta.GuestOS != "linux" && o.meta.GuestOS != "windows":
		return fmt.Errorf("--guest-os %q: want linux or windows", o.meta.GuestOS)
	case o.parentMemory != "" && len(o.parents) == 0:
		return errors.New("--parent-memory needs --parent")
	}
	return nil
}

// makeLink copies the state files into the output dir and writes the link;
// on failure it removes what it created.
func makeLink(ctx context.Context, o linkOptions) (_ *chain.Link, err error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(o.out, chain.LinkFile)); !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s already holds a link", o.out)
	}
	if len(o.parents) > 0 {
		if _, err := chain.ValidateChain(o.parents); err != nil {
			return nil, fmt.Errorf("parent chain: %w", err)
		}
	}
	created, err := copyStateFiles(o.state, o.out)
	defer func() {
		if err != nil {
			for _, p := range slices.Backward(created) {
				os.Remove(p)
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	for _, s := range o.state {
		o.meta.StateFiles = append(o.meta.StateFiles, filepath.Base(s))
	}
	if len(o.parents) == 0 {
		return chain.WriteFull(ctx, o.memory, o.meta, o.out)
	}
	parentMem := o.parentMemory
	if parentMem == "" {
		parentMem = filepath.Join(filepath.Dir(filepath.Clean(o.out)), ".tmp-parent-memory-"+filepath.Base(o.out))
		if err := chain.Flatten(ctx, o.parents, parentMem); err != nil {
			return nil, fmt.Errorf("flatten parent chain: %w", err)
		}
		defer os.Remove(parentMem)
	}
	return chain.WriteDiff(ctx, o.memory, parentMem, o.parents[len(o.parents)-1], o.meta, o.out)
}

// copyStateFiles copies files into dir (created if missing) and returns
// every path it created, dir included, in creation order.
func copyStateFiles(files []string, dir string) ([]string, error) {
	var created []string
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create link dir: %w", err)
		}
		created = append(created, dir)
	}
	for _, src := range files {
		dst := filepath.Join(dir, filepath.Base(src))
		if _, err := os.Lstat(dst); err == nil {
			return created, fmt.Errorf("state file %s: %s already exists", src, dst)
		}
		if err := cfs.CopyFile(dst, src); err != nil {
			return created, fmt.Errorf("copy state file %s: %w", src, err)
		}
		created = append(created, dst)
	}
	return created, nil
}
