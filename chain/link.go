package chain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
)

// Format constants and the fixed file names of a link directory and of a
// staged directory.
const (
	Version      = 1
	LinkFile     = "link.json"
	ExtentsFile  = "memory.extents"
	DataFile     = "memory.data"
	StagedMemory = "memory"
	StagedChain  = "chain.json"
)

// StateMemoryFiltered is the one non-empty Link.StateMemory: the hypervisor
// wrote guest memory into its state stream and cocoon removed it, keeping
// the stream's structure, so the link's memory files are the only source of
// guest memory. Empty means the hypervisor never wrote guest memory there.
// A restore refuses a value it does not know.
const StateMemoryFiltered = "filtered"

// Kind is a link's kind.
type Kind string

// The two link kinds.
const (
	KindFull Kind = "full"
	KindDiff Kind = "diff"
)

// MemoryInfo describes a link's memory files.
type MemoryInfo struct {
	// Extents is the number of records in memory.extents.
	Extents int64 `json:"extents"`
	// DataBytes is the size of memory.data, the sum of the extent lengths.
	DataBytes     int64         `json:"dataBytes"`
	ExtentsDigest digest.Digest `json:"extentsDigest"`
	DataDigest    digest.Digest `json:"dataDigest"`
}

// Link is the content of link.json.
type Link struct {
	Version         int           `json:"version"`
	Kind            Kind          `json:"kind"`
	Hypervisor      string        `json:"hypervisor"`
	HypervisorBuild string        `json:"hypervisorBuild,omitempty"`
	GuestOS         string        `json:"guestOS"`
	VCPUs           int           `json:"vcpus"`
	MemoryBytes     int64         `json:"memoryBytes"`
	PageSize        int64         `json:"pageSize"`
	HugePages       bool          `json:"hugePages"`
	SharedMemory    bool          `json:"sharedMemory"`
	StateFiles      []string      `json:"stateFiles"`
	StateMemory     string        `json:"stateMemory,omitempty"`
	Parent          digest.Digest `json:"parent,omitempty"`
	Memory          MemoryInfo    `json:"memory"`

	id digest.Digest
}

// RestoresOn fails unless the link restores on the hypervisor name: a link
// is hypervisor-specific (its state files are that hypervisor's). The one
// owner of that rule, for the policy and every driver.
func (l *Link) RestoresOn(name string) error {
	if l.Hypervisor != name {
		return fmt.Errorf("the snapshot was made by %q and restores only there, not on %q", l.Hypervisor, name)
	}
	return nil
}

// ID is the sha256 of the link.json bytes as written. It is set by ReadLink,
// OpenStaged and the writers; a Link built by hand has none.
func (l *Link) ID() digest.Digest { return l.id }

// ReadLink reads and checks dir/link.json. It does not look at the memory
// or state files; Validate does.
func ReadLink(dir string) (*Link, error) {
	path := filepath.Join(dir, LinkFile)
	b, err := ReadLinkFile(path, maxLinkJSON)
	if err != nil {
		return nil, fmt.Errorf("read link: %w", err)
	}
	l, err := ParseLink(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// ParseLink parses and checks link.json bytes; the ID is their sha256.
func ParseLink(b []byte) (*Link, error) {
	var v struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("parse link: %w", err)
	}
	if v.Version == nil {
		return nil, fmt.Errorf("no version field (want %d)", Version)
	}
	if *v.Version != Version {
		return nil, fmt.Errorf("unknown link format version %d (want %d)", *v.Version, Version)
	}
	var l Link
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("parse link: %w", err)
	}
	if err := l.check(); err != nil {
		return nil, err
	}
	l.id = digest.FromBytes(b)
	return &l, nil
}

// check verifies the fields of one link on their own.
func (l *Link) check() error {
	if err := l.checkHeader(); err != nil {
		return err
	}
	return l.Memory.check(l)
}

// checkHeader verifies every field but Memory, which writers fill last.
func (l *Link) checkHeader() error {
	switch {
	case l.Version != Version:
		return fmt.Errorf("unknown link format version %d (want %d)", l.Version, Version)
	case l.Kind != KindFull && l.Kind != KindDiff:
		return fmt.Errorf("unknown link kind %q (want %q or %q)", l.Kind, KindFull, KindDiff)
	case l.Hypervisor == "":
		return fmt.Errorf("hypervisor is empty")
	case l.GuestOS == "":
		return fmt.Errorf("guestOS is empty")
	case l.VCPUs < 1:
		return fmt.Errorf("vcpus is %d, want at least 1", l.VCPUs)
	case l.PageSize < 4096 || l.PageSize&(l.PageSize-1) != 0:
		return fmt.Errorf("page size %d is not a power of two of at least 4096", l.PageSize)
	case l.MemoryBytes <= 0 || l.MemoryBytes%l.PageSize != 0:
		return fmt.Errorf("memory size %d is not a positive multiple of the page size %d", l.MemoryBytes, l.PageSize)
	case l.Kind == KindFull && l.Parent != "":
		return fmt.Errorf("full link names a parent %s", l.Parent)
	case l.Kind == KindDiff && l.Parent == "":
		return fmt.Errorf("diff link names no parent")
	case l.StateMemory != "" && l.StateMemory != StateMemoryFiltered:
		return fmt.Errorf("state memory %q: want empty or %q", l.StateMemory, StateMemoryFiltered)
	}
	if l.Parent != "" {
		if err := l.Parent.Validate(); err != nil {
			return fmt.Errorf("parent %q: %w", l.Parent, err)
		}
	}
	return checkStateFiles(l.StateFiles)
}

func (m *MemoryInfo) check(l *Link) error {
	if m.Extents < 0 || m.DataBytes < 0 || m.DataBytes > l.MemoryBytes {
		return fmt.Errorf("memory: %d extents and %d data bytes do not fit a memory of %d bytes", m.Extents, m.DataBytes, l.MemoryBytes)
	}
	if m.DataBytes%l.PageSize != 0 {
		return fmt.Errorf("memory: data bytes %d is not a multiple of the page size %d", m.DataBytes, l.PageSize)
	}
	if err := m.ExtentsDigest.Validate(); err != nil {
		return fmt.Errorf("memory: extents digest %q: %w", m.ExtentsDigest, err)
	}
	if err := m.DataDigest.Validate(); err != nil {
		return fmt.Errorf("memory: data digest %q: %w", m.DataDigest, err)
	}
	return nil
}

// checkStateFiles allows only plain, unique file names that cannot clash with
// the link's own files or with temp files.
func checkStateFiles(names []string) error {
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		switch {
		case n == "" || n == "." || n == ".." || strings.ContainsAny(n, `/\`):
			return fmt.Errorf("state file %q is not a plain file name", n)
		case n == LinkFile || n == ExtentsFile || n == DataFile || n == StagedMemory || n == StagedChain || isDeltaName(n):
			return fmt.Errorf("state file %q uses a reserved name", n)
		case IsTemp(n):
			return fmt.Errorf("state file %q uses the temp-file prefix %q", n, tempPrefix)
		case seen[n]:
			return fmt.Errorf("state file %q is listed twice", n)
		}
		seen[n] = true
	}
	return nil
}

// checkParent verifies that l may follow parent in a chain.
func checkParent(l, parent *Link) error {
	if l.Kind == KindFull {
		if parent != nil {
			return fmt.Errorf("full link %s cannot follow link %s: a chain has one full link, first", l.id, parent.id)
		}
		return nil
	}
	switch {
	case parent == nil:
		return fmt.Errorf("diff link needs its parent %s", l.Parent)
	case l.Parent != parent.id:
		return fmt.Errorf("parent digest mismatch: link names parent %s, the link before it is %s", l.Parent, parent.id)
	case l.MemoryBytes != parent.MemoryBytes:
		return fmt.Errorf("memory size changes inside the chain: %d bytes, parent has %d", l.MemoryBytes, parent.MemoryBytes)
	case l.PageSize != parent.PageSize:
		return fmt.Errorf("page size changes inside the chain: %d, parent has %d", l.PageSize, parent.PageSize)
	case l.Hypervisor != parent.Hypervisor:
		return fmt.Errorf("hypervisor changes inside the chain: %q, parent has %q", l.Hypervisor, parent.Hypervisor)
	case l.GuestOS != parent.GuestOS:
		return fmt.Errorf("guest OS changes inside the chain: %q, parent has %q", l.GuestOS, parent.GuestOS)
	}
	return nil
}
