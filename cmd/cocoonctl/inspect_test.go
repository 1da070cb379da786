package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func TestInspect(t *testing.T) {
	root := t.TempDir()
	dirs, _ := makeTestChain(t, root)
	links, err := chain.ValidateChain(dirs)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(root, "chain.tar")
	if _, err := runChainCmd(t, "pack", append([]string{"--name", "snap:v1", "--out", archive}, dirs...)...); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(root, "staged")
	if err := os.Mkdir(staged, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStaged(staged, links); err != nil {
		t.Fatal(err)
	}
	if err := chain.Flatten(context.Background(), dirs, filepath.Join(staged, chain.StagedMemory)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, source string
		links        int
	}{
		{archive, "archive", 2},
		{dirs[1], "link", 1},
		{staged, "staged", 2},
	}
	for _, tt := range tests {
		t.Run(tt.source, func(t *testing.T) {
			out, err := runChainCmd(t, "inspect", tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(out, tt.source+" ") || !strings.Contains(out, links[1].ID().Encoded()[:12]) {
				t.Errorf("inspect output:\n%s", out)
			}
			out, err = runChainCmd(t, "inspect", "--json", tt.path)
			if err != nil {
				t.Fatal(err)
			}
			var r inspected
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.Source != tt.source || len(r.Links) != tt.links || r.Links[len(r.Links)-1].ID != links[1].ID().String() {
				t.Errorf("inspect --json: %+v", r)
			}
		})
	}
	// A short memory, as a broken disk leaves it (staged memory is 0444).
	memory := filepath.Join(staged, chain.StagedMemory)
	if err := os.Chmod(memory, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(memory, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := runChainCmd(t, "inspect", staged); err == nil || !strings.Contains(err.Error(), "the chain's memory is") {
		t.Fatalf("inspect of a staged dir with a short memory: %v", err)
	}
}
