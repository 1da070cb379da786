package chain

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStagedRoundTrip(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	links, err := ValidateChain(c.dirs)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "staged")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteStaged(dir, links); err != nil {
		t.Fatal(err)
	}
	s, err := OpenStaged(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Links) != 3 {
		t.Fatalf("%d links, want 3", len(s.Links))
	}
	for i, l := range s.Links {
		if l.ID() != links[i].ID() {
			t.Errorf("link %d ID %s, want %s", i, l.ID(), links[i].ID())
		}
	}
	if s.Top().ID() != links[2].ID() {
		t.Errorf("top is %s, want %s", s.Top().ID(), links[2].ID())
	}
	if s.MemoryPath() != filepath.Join(dir, StagedMemory) || s.StatePath("qemu.state") != filepath.Join(dir, "qemu.state") {
		t.Errorf("paths %s %s", s.MemoryPath(), s.StatePath("qemu.state"))
	}
}

func TestStagedRejectsBrokenChain(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	links, err := ValidateChain(c.dirs)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		links []*Link
		want  string
	}{
		{"empty", nil, "no links"},
		{"gap", []*Link{links[0], links[2]}, "parent digest mismatch"},
		{"no ID", []*Link{{Kind: KindFull}}, "no ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := WriteStaged(t.TempDir(), tt.links)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("WriteStaged: %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StagedChain), []byte(`{"version":9,"links":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStaged(dir); err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("OpenStaged of version 9: %v", err)
	}
}
