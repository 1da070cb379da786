package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/image-spec/identity"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
)

// TestPackImportsWithCtr imports a packed chain into a real containerd with
// `ctr images import`, unpacked by the stock native snapshotter, and checks
// that every unpacked layer is its link and the chain flattens to the memory.
func TestPackImportsWithCtr(t *testing.T) {
	root := t.TempDir()
	dirs, want := makeTestChain(t, root)
	archive := filepath.Join(root, "chain.tar")
	const ref = "example.com/cocoon/pack-test:v1"
	if _, err := runChainCmd(t, "pack", append([]string{"--name", ref, "--out", archive}, dirs...)...); err != nil {
		t.Fatal(err)
	}
	c := ctrdtest.Start(t, ctrdtest.Options{})
	if _, err := c.Ctr("images", "import", "--local", "--snapshotter", "native", archive); err != nil {
		t.Fatalf("%v\n%s", err, c.Logs())
	}
	if out, err := c.Ctr("images", "ls", "-q"); err != nil || !strings.Contains(out, ref) {
		t.Fatalf("images ls: %q, %v", out, err)
	}
	ctx := context.Background()
	img, err := c.Client().GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn := c.Client().SnapshotService("native")
	var unpacked []string
	for i, chainID := range identity.ChainIDs(diffIDs) {
		// Every link has the same file names, so layer i's view holds exactly link i.
		key := "view-" + chainID.Encoded()
		mounts, err := sn.View(ctx, key, chainID.String())
		if err != nil {
			t.Fatalf("view layer %d: %v", i, err)
		}
		t.Cleanup(func() { sn.Remove(context.Background(), key) })
		if len(mounts) != 1 || mounts[0].Type != "bind" {
			t.Fatalf("native view mounts %+v", mounts)
		}
		if _, err := chain.ValidateDir(mounts[0].Source); err != nil {
			t.Fatalf("unpacked layer %d: %v", i, err)
		}
		unpacked = append(unpacked, mounts[0].Source)
	}
	flat := filepath.Join(root, "flat")
	if err := chain.Flatten(ctx, unpacked, flat); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(flat)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("chain unpacked by containerd flattens to different memory")
	}
}
