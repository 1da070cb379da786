package chain

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/opencontainers/go-digest"
)

// Staged is a chain staged for one restore: a directory holding the chain's
// flattened memory (StagedMemory), private copies of the top link's state
// files, and chain.json (StagedChain) describing the links.
type Staged struct {
	Dir string
	// Links is the chain, oldest first.
	Links []*Link
	// Memory says which links the staged memory file holds.
	Memory StagedMemoryInfo
}

// stagedFile is chain.json. Each link keeps its ID, since re-encoding a
// Link need not reproduce the bytes its ID was computed from.
type stagedFile struct {
	Version int               `json:"version"`
	Links   []stagedLink      `json:"links"`
	Memory  *StagedMemoryInfo `json:"memory,omitempty"`
}

type stagedLink struct {
	ID   digest.Digest `json:"id"`
	Link *Link         `json:"link"`
}

// Top is the newest link, the one whose state is restored.
func (s *Staged) Top() *Link { return s.Links[len(s.Links)-1] }

// MemoryPath is the staged memory file.
func (s *Staged) MemoryPath() string { return filepath.Join(s.Dir, StagedMemory) }

// StatePath is the staged copy of the top link's state file name.
func (s *Staged) StatePath(name string) string { return filepath.Join(s.Dir, name) }

// WriteStaged writes dir/chain.json for links, oldest first, atomically
// (temp file and rename) but without fsync: a staged dir serves VMs of the
// current boot only, and its maker re-stages it after a host crash. The
// staged memory holds every link; WriteStagedMemory says otherwise.
func WriteStaged(dir string, links []*Link) error {
	return WriteStagedMemory(dir, links, StagedMemoryInfo{})
}

// WriteStagedMemory is WriteStaged for a memory file that holds the first
// m.Covers links (all when zero); the others' memory files must be staged
// as delta files (DeltaPaths).
func WriteStagedMemory(dir string, links []*Link, m StagedMemoryInfo) error {
	if err := checkLinks(links); err != nil {
		return fmt.Errorf("write staged chain: %w", err)
	}
	if err := m.check(len(links)); err != nil {
		return fmt.Errorf("write staged chain: %w", err)
	}
	sf := stagedFile{Version: Version, Links: make([]stagedLink, len(links))}
	if m != (StagedMemoryInfo{}) {
		sf.Memory = &m
	}
	for i, l := range links {
		sf.Links[i] = stagedLink{ID: l.id, Link: l}
	}
	b, err := json.MarshalIndent(sf, "", "  ")
	if err != nil {
		return fmt.Errorf("write staged chain: %w", err)
	}
	return replaceFile(filepath.Join(dir, StagedChain), append(b, '\n'), 0o644)
}

// OpenStaged reads dir/chain.json and checks that its links form a chain.
func OpenStaged(dir string) (*Staged, error) {
	path := filepath.Join(dir, StagedChain)
	b, err := ReadLinkFile(path, maxStagedChain)
	if err != nil {
		return nil, fmt.Errorf("open staged chain: %w", err)
	}
	var sf stagedFile
	if err := json.Unmarshal(b, &sf); err != nil {
		return nil, fmt.Errorf("%s: parse: %w", path, err)
	}
	if sf.Version != Version {
		return nil, fmt.Errorf("%s: unknown chain format version %d (want %d)", path, sf.Version, Version)
	}
	links := make([]*Link, len(sf.Links))
	for i, sl := range sf.Links {
		if sl.Link == nil {
			return nil, fmt.Errorf("%s: link %d is empty", path, i)
		}
		if err := sl.ID.Validate(); err != nil {
			return nil, fmt.Errorf("%s: link %d id %q: %w", path, i, sl.ID, err)
		}
		if err := sl.Link.check(); err != nil {
			return nil, fmt.Errorf("%s: link %d: %w", path, i, err)
		}
		sl.Link.id = sl.ID
		links[i] = sl.Link
	}
	if err := checkLinks(links); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	st := &Staged{Dir: dir, Links: links}
	if sf.Memory != nil {
		st.Memory = *sf.Memory
	}
	if err := st.Memory.check(len(links)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if st.Memory.Covers == 0 {
		st.Memory.Covers = len(links)
	}
	return st, nil
}

// checkLinks checks that links, oldest first, form one chain.
func checkLinks(links []*Link) error {
	if len(links) == 0 {
		return fmt.Errorf("chain has no links")
	}
	var parent *Link
	for i, l := range links {
		if l.id == "" {
			return fmt.Errorf("link %d has no ID (not read from disk)", i)
		}
		if err := checkParent(l, parent); err != nil {
			return fmt.Errorf("link %d: %w", i, err)
		}
		parent = l
	}
	return nil
}
