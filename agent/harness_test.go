package agent_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server"
)

// callTimeout bounds every call a test makes.
const callTimeout = 30 * time.Second

// fakeQEMU plays QEMU's virtio-serial chardev: hosts connect to a unix
// socket one at a time, and the guest end (its Read/Write/Close) sees one
// stream that reads io.EOF when a host leaves and drops writes while no host
// is connected.
type fakeQEMU struct {
	ln   net.Listener
	mu   sync.Mutex
	cond *sync.Cond
	cur  net.Conn
	shut bool
}

func newFakeQEMU(ln net.Listener) *fakeQEMU {
	q := &fakeQEMU{ln: ln}
	q.cond = sync.NewCond(&q.mu)
	go q.acceptLoop()
	return q
}

func (q *fakeQEMU) acceptLoop() {
	for {
		c, err := q.ln.Accept()
		if err != nil {
			return
		}
		q.mu.Lock()
		if q.cur != nil {
			q.cur.Close()
		}
		q.cur = c
		q.cond.Broadcast()
		q.mu.Unlock()
	}
}

func (q *fakeQEMU) current() (net.Conn, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.cur == nil && !q.shut {
		q.cond.Wait()
	}
	if q.shut {
		return nil, net.ErrClosed
	}
	return q.cur, nil
}

func (q *fakeQEMU) Read(b []byte) (int, error) {
	c, err := q.current()
	if err != nil {
		return 0, err
	}
	n, err := c.Read(b)
	if err != nil {
		q.mu.Lock()
		if q.cur == c {
			q.cur = nil
		}
		q.mu.Unlock()
		return 0, io.EOF
	}
	return n, nil
}

func (q *fakeQEMU) Write(b []byte) (int, error) {
	q.mu.Lock()
	c := q.cur
	q.mu.Unlock()
	if c != nil {
		_, _ = c.Write(b)
	}
	return len(b), nil
}

func (q *fakeQEMU) Close() error {
	q.mu.Lock()
	q.shut = true
	if q.cur != nil {
		q.cur.Close()
	}
	q.cond.Broadcast()
	q.mu.Unlock()
	return q.ln.Close()
}

// fakeSystem records what Init and Shutdown would change on a guest.
type fakeSystem struct {
	mu       sync.Mutex
	time     time.Time
	entropy  []byte
	hostname string
	sysctls  map[string]string
	synced   bool
	off      chan struct{}
}

func (s *fakeSystem) KernelRelease() string { return "6.1.0-test" }
func (s *fakeSystem) SetTime(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.time = t
	return nil
}
func (s *fakeSystem) AddEntropy(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entropy = append([]byte(nil), b...)
	return nil
}
func (s *fakeSystem) SetHostname(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hostname = name
	return nil
}
func (s *fakeSystem) SetSysctl(key, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sysctls == nil {
		s.sysctls = map[string]string{}
	}
	s.sysctls[key] = value
	return nil
}
func (s *fakeSystem) Sync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced = true
}
func (s *fakeSystem) PowerOff() error {
	close(s.off)
	return nil
}

// fakeNetwork records the NIC configurations Init asks for.
type fakeNetwork struct {
	mu  sync.Mutex
	got []*server.NetConfig
}

func (n *fakeNetwork) Configure(cfg *server.NetConfig) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, cfg)
	return nil
}

func (n *fakeNetwork) last() *server.NetConfig {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.got) == 0 {
		return nil
	}
	return n.got[len(n.got)-1]
}

// fakeMounter mounts nothing: the container's root is whatever the test
// put in the state directory's root.
type fakeMounter struct {
	mu     sync.Mutex
	mounts []string // target fstype
}

func (m *fakeMounter) Disk(context.Context, string, uint64) (string, error) { return "/dev/vdz", nil }

func (m *fakeMounter) Mount(_, target, fstype string, _ uintptr, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mounts = append(m.mounts, target+" "+fstype)
	return nil
}

func (m *fakeMounter) Unmount(string) error { return nil }

func (m *fakeMounter) Mknod(path string, _ uint32, _ uint64) error {
	return os.WriteFile(path, nil, 0o666)
}

// harness runs the guest server in-process behind a fakeQEMU socket, on a
// fake system, NIC and mounter, with its state in a temp dir.
type harness struct {
	sock  string
	sys   *fakeSystem
	net   *fakeNetwork
	mnt   *fakeMounter
	state string
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	dir, err := os.MkdirTemp("", "cocoon-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &harness{
		sock: filepath.Join(dir, "agent.sock"), sys: &fakeSystem{off: make(chan struct{})},
		net: &fakeNetwork{}, mnt: &fakeMounter{}, state: filepath.Join(dir, "state"),
	}
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(h.sys, server.WithNetwork(h.net), server.WithMounter(h.mnt), server.WithStateDir(h.state))
	srv, err := server.NewTTRPCServer(svc)
	if err != nil {
		t.Fatal(err)
	}
	l := agent.ListenSerial(newFakeQEMU(ln))
	served := make(chan struct{})
	go func() { _ = srv.Serve(context.Background(), l); close(served) }()
	t.Cleanup(func() {
		_ = srv.Close()
		_ = l.Close()
		<-served
	})
	return h
}

func (h *harness) dial(ctx context.Context) (net.Conn, error) {
	return agent.DialUnix(ctx, h.sock)
}

func (h *harness) client(t testing.TB) *agent.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := agent.WaitReady(ctx, h.dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// result is what a finished process left.
type result struct {
	stdout, stderr string
	status         agent.ExitStatus
}

// run execs r, feeds it stdin, drains stdout and stderr separately and waits.
func run(t *testing.T, c *agent.Client, r agent.ExecRequest, stdin string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	p, err := c.Exec(ctx, r)
	if err != nil {
		t.Fatalf("exec %v: %v", r.Args, err)
	}
	return drain(t, c, p, stdin)
}

// drain feeds p, just started, stdin, drains stdout and stderr separately
// and waits.
func drain(t *testing.T, c *agent.Client, p *agent.Process, stdin string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	in, out, errOut := p.Stdio()
	var res result
	var err error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); res.stdout = readAll(t, out) }()
	if errOut != nil {
		wg.Add(1)
		go func() { defer wg.Done(); res.stderr = readAll(t, errOut) }()
	}
	if in != nil {
		if _, err := io.WriteString(in, stdin); err != nil {
			t.Errorf("write stdin: %v", err)
		}
		if err := in.Close(); err != nil {
			t.Errorf("close stdin: %v", err)
		}
	}
	wg.Wait()
	if res.status, err = c.Wait(ctx, p.ID); err != nil {
		t.Fatalf("wait %s: %v", p.ID, err)
	}
	return res
}

func readAll(t *testing.T, r io.Reader) string {
	var b bytes.Buffer
	if _, err := io.Copy(&b, r); err != nil {
		t.Errorf("read output: %v", err)
	}
	return b.String()
}
