package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server/guestfile"
)

// filesAgent checks and writes what UpdateFiles and Init send as the
// guest does (guestfile), here under a test's directory.
type filesAgent struct {
	api.AgentService
	version string

	mu      sync.Mutex
	updates int
	removed []string
	initN   int // files Init carried
}

func (a *filesAgent) Ping(context.Context, *emptypb.Empty) (*api.PingResponse, error) {
	return &api.PingResponse{Version: a.version}, nil
}

func (a *filesAgent) UpdateFiles(_ context.Context, req *api.UpdateFilesRequest) (*emptypb.Empty, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.updates++
	files, err := guestfile.CheckPieces(req.Files)
	if err != nil {
		return nil, err
	}
	if len(req.Remove) > api.MaxFiles {
		return nil, fmt.Errorf("%d removals: %w", len(req.Remove), errdefs.ErrInvalidArgument)
	}
	a.removed = append(a.removed, req.Remove...)
	return &emptypb.Empty{}, guestfile.Write(files)
}

func (a *filesAgent) Init(_ context.Context, req *api.InitRequest) (*api.InitResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	files, err := guestfile.Check(req.Files)
	if err != nil {
		return nil, err
	}
	a.initN = len(files)
	return &api.InitResponse{Version: a.version}, guestfile.Write(files)
}

// bigTree is more than one request carries: 300 files in a directory, a
// file of 3 MiB and a link to it.
func bigTree(dir string) ([]agent.File, []byte) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
	files := []agent.File{{Path: dir + "/d", Mode: fs.ModeDir | 0o750}}
	for i := range 300 {
		files = append(files, agent.File{Path: fmt.Sprintf("%s/d/%03d", dir, i), Data: []byte(fmt.Sprint(i))})
	}
	files = append(files, agent.File{Path: dir + "/big", Data: big, Mode: 0o600},
		agent.File{Path: dir + "/link", Data: []byte("big"), Mode: fs.ModeSymlink | fs.ModePerm})
	return files, big
}

// TestInitSendsAhead: files one Init cannot carry go first, with
// UpdateFiles, in requests within the agent's bounds, the large one in
// pieces, and arrive whole; what fits goes with Init alone.
func TestInitSendsAhead(t *testing.T) {
	a := &filesAgent{version: "8"}
	c := serveFake(t, a)
	dir := t.TempDir()
	files, big := bigTree(dir)
	if _, err := c.Init(ctxT(t), agent.InitRequest{Files: files}); err != nil {
		t.Fatal(err)
	}
	if a.initN != 0 || a.updates < 4 {
		t.Fatalf("Init carried %d files after %d UpdateFiles calls, want none after at least 4", a.initN, a.updates)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "link")); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("the large file through its link: %d bytes, %v, want %d", len(b), err, len(big))
	}
	if entries, err := os.ReadDir(filepath.Join(dir, "d")); err != nil || len(entries) != 300 {
		t.Fatalf("the directory holds %d entries, %v, want 300", len(entries), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "d")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("the directory's mode: %v, %v", fi.Mode(), err)
	}

	small := []agent.File{{Path: filepath.Join(dir, "small"), Data: []byte("x")}}
	updates := a.updates
	if _, err := c.Init(ctxT(t), agent.InitRequest{Files: small}); err != nil {
		t.Fatal(err)
	}
	if a.initN != 1 || a.updates != updates {
		t.Fatalf("a small file: Init carried %d, %d more UpdateFiles calls, want 1 and none", a.initN, a.updates-updates)
	}
}

// TestUpdateFilesSplits: many removals go in several requests, after the
// files; an agent before API 8 takes many files but no file in pieces.
func TestUpdateFilesSplits(t *testing.T) {
	a := &filesAgent{version: "7"}
	c := serveFake(t, a)
	dir := t.TempDir()
	files, _ := bigTree(dir)
	err := c.UpdateFiles(ctxT(t), files, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "needs guest agent API 8") {
		t.Fatalf("a large file to an API 7 agent: %v, want a failed precondition naming API 8", err)
	}
	tmpfs := []agent.File{{Path: dir + "/cache", Mode: fs.ModeDir | 0o777, TmpfsSize: 1 << 20}}
	if err := c.UpdateFiles(ctxT(t), tmpfs, nil); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "a directory that is a tmpfs of its own") {
		t.Fatalf("a tmpfs to an API 7 agent: %v, want a failed precondition naming it", err)
	}
	if a.updates != 0 {
		t.Fatalf("%d UpdateFiles calls before the refusals, want none", a.updates)
	}
	small := files[:len(files)-2]
	remove := make([]string, 200)
	for i := range remove {
		remove[i] = fmt.Sprintf("%s/gone%d", dir, i)
	}
	if err := c.UpdateFiles(ctxT(t), small, remove); err != nil {
		t.Fatal(err)
	}
	if a.updates != 4 || len(a.removed) != 200 { // 128 + 128 + 45 entries and 83 removals, then 117
		t.Fatalf("%d calls removing %d paths, want 4 and 200", a.updates, len(a.removed))
	}
}
