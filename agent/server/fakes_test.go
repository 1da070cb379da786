package server

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// journal records what the fakes were asked to do, in order.
type journal struct {
	mu      sync.Mutex
	entries []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, fmt.Sprintf(format, args...))
}

func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.entries...)
}

// steps is the first word of every entry.
func (j *journal) steps() []string {
	var out []string
	for _, e := range j.all() {
		out = append(out, strings.Fields(e)[0])
	}
	return out
}

type fakeSystem struct {
	j   *journal
	err map[string]error
}

func (s *fakeSystem) KernelRelease() string { return "test" }
func (s *fakeSystem) SetTime(t time.Time) error {
	s.j.add("clock %d", t.Unix())
	return s.err["clock"]
}
func (s *fakeSystem) AddEntropy(b []byte) error {
	s.j.add("entropy %d", len(b))
	return s.err["entropy"]
}
func (s *fakeSystem) SetHostname(name string) error {
	s.j.add("hostname %s", name)
	return s.err["hostname"]
}
func (s *fakeSystem) SetSysctl(key, value string) error {
	s.j.add("sysctl %s=%s", key, value)
	return s.err["sysctl"]
}
func (s *fakeSystem) Sync()           {}
func (s *fakeSystem) PowerOff() error { return nil }

type fakeNetwork struct {
	j     *journal
	got   []*NetConfig
	err   error
	check func() string // its answer goes into the journal entry
}

func (n *fakeNetwork) Configure(cfg *NetConfig) error {
	note := ""
	if n.check != nil {
		note = n.check()
	}
	n.j.add("network %v %s", cfg != nil, note)
	n.got = append(n.got, cfg)
	return n.err
}

// fakeMounter records mounts, unmounts and nodes; Disk answers dev.
type fakeMounter struct {
	j       *journal
	dev     string
	diskErr error
	failAt  string // a mount target that fails
}

func (m *fakeMounter) Disk(_ context.Context, serial string, _ uint64) (string, error) {
	m.j.add("disk %s", serial)
	return m.dev, m.diskErr
}

func (m *fakeMounter) Mount(source, target, fstype string, flags uintptr, data string) error {
	m.j.add("mount %s %s %s %#x %s", source, target, fstype, flags, data)
	if target == m.failAt {
		return fmt.Errorf("fake mount failure")
	}
	return nil
}

func (m *fakeMounter) Unmount(target string) error {
	m.j.add("unmount %s", target)
	return nil
}

func (m *fakeMounter) Mknod(path string, mode uint32, dev uint64) error {
	m.j.add("mknod %s %#o %d", path, mode, dev)
	return os.WriteFile(path, nil, 0o666)
}

// fakeGuest is a Service on fakes, with its state in a temp dir.
type fakeGuest struct {
	svc   *Service
	j     *journal
	sys   *fakeSystem
	net   *fakeNetwork
	mnt   *fakeMounter
	state string
}

func newFakeGuest(t *testing.T, opts ...Option) *fakeGuest {
	t.Helper()
	j := &journal{}
	g := &fakeGuest{
		j: j, sys: &fakeSystem{j: j}, net: &fakeNetwork{j: j}, mnt: &fakeMounter{j: j, dev: "/dev/vdz"},
		state: t.TempDir(),
	}
	all := append([]Option{WithNetwork(g.net), WithMounter(g.mnt), WithStateDir(g.state)}, opts...)
	g.svc = New(g.sys, all...)
	t.Cleanup(g.discardPrepared)
	return g
}

// discardPrepared gives up the processes an Init or Exec prepared but no
// Start ran, each a real child held before its first instruction.
func (g *fakeGuest) discardPrepared() {
	g.svc.mu.Lock()
	ids := slices.Collect(maps.Keys(g.svc.procs))
	g.svc.mu.Unlock()
	for _, id := range ids {
		_, _ = g.svc.Delete(context.Background(), &api.ProcessRequest{Id: id})
	}
}

func (g *fakeGuest) root() string { return filepath.Join(g.state, "root") }
