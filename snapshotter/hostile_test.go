package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// TestCommitRejectsHostileLinkFiles commits, over gRPC, layers whose files
// are symlinks (which would pull host files into staged dirs and packs) or
// FIFOs (which would block Commit forever): each must be refused, in time,
// as an invalid link.
func TestCommitRejectsHostileLinkFiles(t *testing.T) {
	fx := makeChain(t, t.TempDir(), 70, 32, 1)
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sn := serveInProcess(t)
	tests := []struct {
		name    string
		file    string
		hostile func(t *testing.T, path string)
		wantErr string
	}{
		{"state file is a symlink to a host file", "qemu.state", func(t *testing.T, p string) { replaceWithSymlink(t, secret, p) },
			"a symbolic link, want a regular file"},
		{"link.json is a symlink", chain.LinkFile, func(t *testing.T, p string) {
			replaceWithSymlink(t, filepath.Join(fx.dirs[0], chain.LinkFile), p)
		}, "a symbolic link, want a regular file"},
		{"memory.data is a symlink", chain.DataFile, func(t *testing.T, p string) {
			replaceWithSymlink(t, filepath.Join(fx.dirs[0], chain.DataFile), p)
		}, "a symbolic link, want a regular file"},
		{"link.json is a FIFO", chain.LinkFile, replaceWithFIFO, "FIFO, want a regular file"},
		{"memory.extents is a FIFO", chain.ExtentsFile, replaceWithFIFO, "FIFO, want a regular file"},
		{"state file is a FIFO", "qemu.state", replaceWithFIFO, "FIFO, want a regular file"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			name := fmt.Sprintf("hostile-%d", i)
			key := "extract-" + name
			labels := snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: name})
			ms, err := sn.Prepare(ctx, key, "", labels)
			if err != nil {
				t.Fatal(err)
			}
			dir := mountDir(t, ms)
			copyDir(t, fx.dirs[0], dir)
			tc.hostile(t, filepath.Join(dir, tc.file))
			err = sn.Commit(ctx, name, key)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("commit: %v, want an invalid-argument error containing %q", err, tc.wantErr)
			}
			if _, err := sn.Stat(ctx, name); !errdefs.IsNotFound(err) {
				t.Errorf("a hostile link was published: Stat = %v", err)
			}
			if err := sn.Remove(ctx, key); err != nil {
				t.Errorf("remove the rejected snapshot: %v", err)
			}
		})
	}
}

// TestStageRefusesSymlinkedStateFile: a committed link whose state file
// became a symlink (committed by an older version, or changed on disk)
// must not have the host file it names copied into a container's staged
// dir.
func TestStageRefusesSymlinkedStateFile(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 71, 32, 1)
	sn := newSnapshotter(t, t.TempDir())
	top := importChain(t, sn, fx, "linked")
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(sn.dir(snapshotID(t, sn, top)), "qemu.state")
	replaceWithSymlink(t, secret, state)
	_, err := sn.Prepare(ctx, "ctr", top)
	if err == nil || !strings.Contains(err.Error(), "a symbolic link, want a regular file") {
		t.Fatalf("prepare over a symlinked state file: %v, want it refused", err)
	}
}

func replaceWithSymlink(t *testing.T, target, path string) {
	t.Helper()
	removeFromLink(t, path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func replaceWithFIFO(t *testing.T, path string) {
	t.Helper()
	removeFromLink(t, path)
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}
