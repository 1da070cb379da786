package restore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/server"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// fakeSystem is the guest machine the in-process agent changes.
type fakeSystem struct {
	setTimeErr error
	hang       chan struct{} // SetHostname waits on it when set

	mu       sync.Mutex
	time     time.Time
	entropy  []byte
	hostname string
}

func (s *fakeSystem) KernelRelease() string { return "6.1.0-test" }

func (s *fakeSystem) SetTime(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.time = t
	return s.setTimeErr
}

func (s *fakeSystem) AddEntropy(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entropy = append([]byte(nil), b...)
	return nil
}

func (s *fakeSystem) SetSysctl(string, string) error { return nil }

func (s *fakeSystem) SetHostname(name string) error {
	if s.hang != nil {
		<-s.hang
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hostname = name
	return nil
}

func (s *fakeSystem) Sync()           {}
func (s *fakeSystem) PowerOff() error { return nil }

// pipeListener hands the guest ends of net.Pipe connections to the agent.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "pipe"} }

// startAgent serves the real agent over pipes with a fake system.
func startAgent(t *testing.T, sys *fakeSystem) *pipeListener {
	t.Helper()
	srv, err := server.NewTTRPCServer(server.New(sys))
	if err != nil {
		t.Fatal(err)
	}
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() { srv.Close(); l.Close() })
	return l
}

// agentState is how the guest agent behaves when dialled.
type agentState int

const (
	agentUp      agentState = iota
	agentRefused            // the VMM socket refuses connections
	agentMute               // accepts the connection, never answers a call
)

// fakeDriver restores fakeVMs, reporting spawn and load like a real driver.
type fakeDriver struct {
	restoreErr error
	vm         *fakeVM
	got        hypervisor.RestoreRequest
}

func (d *fakeDriver) Name() string { return "fake" }

func (d *fakeDriver) Capabilities(context.Context) (hypervisor.Capabilities, error) {
	return hypervisor.Capabilities{RestoreModes: []hypervisor.Mode{hypervisor.ModeCopy}}, nil
}

func (d *fakeDriver) Restore(_ context.Context, req hypervisor.RestoreRequest) (hypervisor.VM, error) {
	d.got = req
	req.Phase("spawn", time.Millisecond)
	if d.restoreErr != nil {
		return nil, d.restoreErr
	}
	req.Phase("load", 2*time.Millisecond)
	return d.vm, nil
}

// fakeVM records its calls and the agent connections it handed out.
type fakeVM struct {
	resumeErr error
	agent     agentState
	guest     *pipeListener

	// exited, when set, is closed once the hypervisor process has exited;
	// nil: it runs until it is closed.
	exited chan struct{}

	mu      sync.Mutex
	calls   []string
	closed  int
	running bool
	conns   []*trackedConn
}

func (v *fakeVM) record(call string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.calls = append(v.calls, call)
}

func (v *fakeVM) PID() int { return 4242 }

func (v *fakeVM) Resume(context.Context) error {
	v.record("resume")
	if v.resumeErr != nil {
		return v.resumeErr
	}
	v.running = true
	return nil
}

func (v *fakeVM) Pause(context.Context) error    { v.record("pause"); return nil }
func (v *fakeVM) Shutdown(context.Context) error { v.record("shutdown"); return nil }
func (v *fakeVM) Kill() error                    { v.record("kill"); return nil }

func (v *fakeVM) Wait(ctx context.Context) error {
	select {
	case <-v.exited:
		return errors.New("signal: killed")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *fakeVM) DialAgent(ctx context.Context) (net.Conn, error) {
	v.record("dial")
	if v.agent == agentRefused {
		return nil, errors.New("connection refused")
	}
	host, guest := net.Pipe()
	switch v.agent {
	case agentUp:
		select {
		case v.guest.conns <- guest:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case agentMute:
		// Like a socket buffer: takes the bytes, never answers.
		go io.Copy(io.Discard, guest)
	}
	tc := &trackedConn{Conn: host, peer: guest}
	v.mu.Lock()
	v.conns = append(v.conns, tc)
	v.mu.Unlock()
	return tc, nil
}

func (v *fakeVM) Close() error {
	v.record("close")
	v.mu.Lock()
	defer v.mu.Unlock()
	v.closed++
	v.running = false
	for _, c := range v.conns {
		c.peer.Close() // the guest ends die with the VM
	}
	return nil
}

// openConns counts the host-side agent connections not closed by Run.
func (v *fakeVM) openConns() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, c := range v.conns {
		if !c.isClosed() {
			n++
		}
	}
	return n
}

type trackedConn struct {
	net.Conn
	peer   net.Conn
	mu     sync.Mutex
	closed bool
}

func (c *trackedConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.Conn.Close()
}

func (c *trackedConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// testRequest is a copy restore of a staged directory holding a memory link.
func testRequest(t *testing.T) Request {
	t.Helper()
	staged := t.TempDir()
	if err := os.WriteFile(filepath.Join(staged, chain.StagedMemory), []byte("guest memory"), 0o444); err != nil {
		t.Fatal(err)
	}
	return Request{StagedDir: staged, RunDir: "/run/vm", Hostname: "clone-1", AgentTimeout: 300 * time.Millisecond,
		Plan: Plan{Mode: hypervisor.ModeCopy, ReleaseAfterLoad: true}}
}

// stagedMemoryLinked reports whether r's staged memory is still there.
func stagedMemoryLinked(t *testing.T, r Request) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(r.StagedDir, chain.StagedMemory))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestRunPhasesInOrder(t *testing.T) {
	sys := &fakeSystem{}
	vm := &fakeVM{guest: startAgent(t, sys)}
	d := &fakeDriver{vm: vm}
	before := time.Now()
	r := testRequest(t)
	res, err := Run(context.Background(), d, r)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { res.Agent.Close(); res.VM.Close() })
	if d.got.Mode != hypervisor.ModeCopy || d.got.StagedDir != r.StagedDir || d.got.RunDir != "/run/vm" {
		t.Errorf("restore request = %+v", d.got)
	}
	if want := []string{"spawn", "load", PhaseResume, PhaseAgent, PhaseInit, GuestPhasePrefix + api.PhaseIdentity, PhaseRelease}; !reflect.DeepEqual(phaseNames(res.Report), want) {
		t.Fatalf("phases = %v, want %v", phaseNames(res.Report), want)
	}
	if stagedMemoryLinked(t, r) {
		t.Error("staged memory still linked after a copy restore succeeded")
	}
	if res.Report.Total <= 0 || res.Report.Plan.Mode != hypervisor.ModeCopy || res.VM != vm {
		t.Errorf("result = %+v", res)
	}
	if want := []string{"resume", "dial"}; !reflect.DeepEqual(vm.calls, want) {
		t.Errorf("vm calls = %v, want %v", vm.calls, want)
	}
	if err := res.Agent.Ping(context.Background()); err != nil {
		t.Errorf("agent from Run does not answer: %v", err)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if sys.time.Before(before) || sys.time.After(time.Now()) {
		t.Errorf("guest clock set to %v, want the restore time", sys.time)
	}
	if len(sys.entropy) != 32 || bytes.Equal(sys.entropy, make([]byte, 32)) {
		t.Errorf("guest entropy = %x, want 32 random bytes", sys.entropy)
	}
	if sys.hostname != "clone-1" {
		t.Errorf("guest hostname = %q, want clone-1", sys.hostname)
	}
}

// TestRunFailureLeavesNothing fails each step in turn: the error names the
// step, the VM is closed exactly once (unless the driver itself failed, and
// cleaned up), no agent connection is left open and the staged memory is
// still there for a retry.
func TestRunFailureLeavesNothing(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		driverErr error
		resumeErr error
		agent     agentState
		initErr   error
		initHangs bool
		want      string
		closes    int
		// vmExits has the hypervisor dead from the start, with an agent
		// timeout beyond the test's: only noticing the exit ends the wait.
		vmExits bool
	}{
		{"restore", boom, nil, agentUp, nil, false, "restore fake vm in copy mode: boom", 0, false},
		{"resume", nil, boom, agentUp, nil, false, "resume vm: boom", 1, false},
		{"agent refuses", nil, nil, agentRefused, nil, false, "connection refused", 1, false},
		{"agent never answers", nil, nil, agentMute, nil, false, "guest agent did not answer within 300ms", 1, false},
		{"init fails", nil, nil, agentUp, boom, false, "init guest identity", 1, false},
		{"init hangs", nil, nil, agentUp, nil, true, "deadline exceeded", 1, false},
		{"hypervisor exits before its agent answers", nil, nil, agentRefused, nil, false,
			"hypervisor exited before the guest was up: pid 4242: signal: killed", 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sys := &fakeSystem{setTimeErr: tt.initErr}
			if tt.initHangs {
				sys.hang = make(chan struct{})
				t.Cleanup(func() { close(sys.hang) })
			}
			vm := &fakeVM{resumeErr: tt.resumeErr, agent: tt.agent, guest: startAgent(t, sys)}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := testRequest(t)
			if tt.vmExits {
				vm.exited = make(chan struct{})
				close(vm.exited)
				r.AgentTimeout = time.Minute
			}
			res, err := Run(ctx, &fakeDriver{vm: vm, restoreErr: tt.driverErr}, r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Run = %+v, %v; want an error containing %q", res, err, tt.want)
			}
			if !stagedMemoryLinked(t, r) {
				t.Error("a failed copy restore released the staged memory: a retry cannot restore")
			}
			if vm.closed != tt.closes || vm.running {
				t.Errorf("vm closed %d times (want %d), running %v", vm.closed, tt.closes, vm.running)
			}
			if n := vm.openConns(); n != 0 {
				t.Errorf("%d agent connections left open", n)
			}
		})
	}
}

func TestRunRejectsNoAgentTimeout(t *testing.T) {
	r := testRequest(t)
	r.AgentTimeout = 0
	d := &fakeDriver{vm: &fakeVM{}}
	if _, err := Run(context.Background(), d, r); err == nil {
		t.Fatal("Run with no agent timeout succeeded")
	}
	if d.got.StagedDir != "" {
		t.Error("restore started despite the bad request")
	}
}

// TestRunRelease checks that only a plan that releases the staged memory
// unlinks it, and that a release that fails leaves the VM running: the
// report then has no release phase.
func TestRunRelease(t *testing.T) {
	tests := []struct {
		name         string
		mode         hypervisor.Mode
		release      bool
		noMemory     bool
		wantReleased bool
	}{
		{"copy", hypervisor.ModeCopy, true, false, true},
		{"mmap keeps the link", hypervisor.ModeMmap, false, false, false},
		{"release fails", hypervisor.ModeCopy, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vm := &fakeVM{guest: startAgent(t, &fakeSystem{})}
			r := testRequest(t)
			r.Plan = Plan{Mode: tt.mode, ReleaseAfterLoad: tt.release}
			if tt.noMemory {
				if err := os.Remove(filepath.Join(r.StagedDir, chain.StagedMemory)); err != nil {
					t.Fatal(err)
				}
			}
			res, err := Run(context.Background(), &fakeDriver{vm: vm}, r)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Cleanup(func() { res.Agent.Close(); res.VM.Close() })
			if vm.closed != 0 || !vm.running {
				t.Errorf("vm closed %d times, running %v: want it running", vm.closed, vm.running)
			}
			if released := slices.Contains(phaseNames(res.Report), PhaseRelease); released != tt.wantReleased {
				t.Errorf("phases %v: release reported %v, want %v", phaseNames(res.Report), released, tt.wantReleased)
			}
			if linked := stagedMemoryLinked(t, r); linked != (!tt.release && !tt.noMemory) {
				t.Errorf("staged memory linked %v after the restore, plan releases it: %v", linked, tt.release)
			}
		})
	}
}

func phaseNames(r Report) []string {
	var names []string
	for _, p := range r.Phases {
		names = append(names, p.Name)
	}
	return names
}

func TestReportString(t *testing.T) {
	r := Report{Phases: []Phase{{"spawn", config.Duration(time.Millisecond)}, {"load", config.Duration(1500 * time.Microsecond)}}, Total: 3 * time.Millisecond}
	if got, want := r.String(), "spawn=1ms load=1.5ms total=3ms"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// TestRunPreparesTheProcess: the guest's Init prepares the process Run is
// given, which then only needs starting.
func TestRunPreparesTheProcess(t *testing.T) {
	testenv.RequireRoot(t) // the agent sets the process's credentials
	vm := &fakeVM{guest: startAgent(t, &fakeSystem{})}
	r := testRequest(t)
	r.Guest.Process = &agent.ExecRequest{ID: "init", Args: []string{"true"}, Cwd: "/"}
	res, err := Run(context.Background(), &fakeDriver{vm: vm}, r)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { res.Agent.Close(); res.VM.Close() })
	if !res.Agent.Prepared("init") {
		t.Fatal("the guest did not prepare the process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := res.Agent.Start(ctx, "init"); err != nil {
		t.Fatal(err)
	}
	if st, err := res.Agent.Wait(ctx, "init"); err != nil || st.Code != 0 {
		t.Errorf("the prepared process exited %+v, %v; want 0", st, err)
	}
}

// TestAddWithin: the guest's steps become phases of their own after the
// call's, which keeps only the rest of its time (never below zero).
func TestAddWithin(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name  string
		call  time.Duration
		guest []agent.Phase
		want  []Phase
	}{
		{"none", ms(10), nil, []Phase{{PhaseInit, config.Duration(ms(10))}}},
		{"two", ms(10), []agent.Phase{{Name: "rootfs", Duration: ms(6)}, {Name: "confine", Duration: ms(1)}},
			[]Phase{{PhaseInit, config.Duration(ms(3))}, {"guest rootfs", config.Duration(ms(6))}, {"guest confine", config.Duration(ms(1))}}},
		{"more than the call", ms(5), []agent.Phase{{Name: "rootfs", Duration: ms(6)}},
			[]Phase{{PhaseInit, 0}, {"guest rootfs", config.Duration(ms(6))}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec recorder
			rec.addWithin(PhaseInit, tc.call, tc.guest)
			if got := rec.list(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("phases %v, want %v", got, tc.want)
			}
		})
	}
}

// A deferred restore leaves the guest as the snapshot had it (no clock,
// entropy or hostname set, no init phase); Claim gives it all later, and
// reports the init phase alone.
func TestDeferredThenClaim(t *testing.T) {
	sys := &fakeSystem{}
	vm := &fakeVM{guest: startAgent(t, sys)}
	r := testRequest(t)
	r.Deferred = true
	res, err := Run(context.Background(), &fakeDriver{vm: vm}, r)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { res.Agent.Close(); res.VM.Close() })
	if want := []string{"spawn", "load", PhaseResume, PhaseAgent, PhaseRelease}; !reflect.DeepEqual(phaseNames(res.Report), want) {
		t.Fatalf("deferred phases = %v, want %v", phaseNames(res.Report), want)
	}
	sys.mu.Lock()
	if sys.hostname != "" || !sys.time.IsZero() || sys.entropy != nil {
		t.Errorf("deferred guest was given an identity: %+v", sys)
	}
	sys.mu.Unlock()
	r.Hostname = "claimed"
	rep, err := Claim(context.Background(), res.Agent, r)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if want := []string{PhaseInit, GuestPhasePrefix + api.PhaseIdentity}; !reflect.DeepEqual(phaseNames(rep), want) {
		t.Errorf("claim phases = %v, want %v", phaseNames(rep), want)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if sys.hostname != "claimed" || sys.time.IsZero() || len(sys.entropy) != entropyBytes {
		t.Errorf("claimed guest: hostname %q, clock %v, %d bytes of entropy", sys.hostname, sys.time, len(sys.entropy))
	}
}
