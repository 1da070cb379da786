package vm

import (
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// fakeDriver "restores" a VM whose hypervisor is a sleep process and whose
// guest agent is the real agent server running in this test process, so
// processes run on the host.
type fakeDriver struct {
	t        *testing.T
	mu       sync.Mutex
	restores []hypervisor.RestoreRequest
	sys      *nopSystem
}

func (d *fakeDriver) Name() string { return "fake" }

func (d *fakeDriver) Capabilities(context.Context) (hypervisor.Capabilities, error) {
	return hypervisor.Capabilities{
		RestoreModes:  []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy},
		SnapshotKinds: []hypervisor.SnapshotKind{hypervisor.SnapshotFull},
	}, nil
}

func (d *fakeDriver) Restore(_ context.Context, req hypervisor.RestoreRequest) (hypervisor.VM, error) {
	d.mu.Lock()
	d.restores = append(d.restores, req)
	d.mu.Unlock()
	if err := os.Mkdir(req.RunDir, 0o700); err != nil {
		return nil, err
	}
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	v := &fakeVM{cmd: cmd, runDir: req.RunDir, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(v.done) }()
	sock := filepath.Join(req.RunDir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		_ = v.Close()
		return nil, err
	}
	srv, err := server.NewTTRPCServer(server.New(d.sys))
	if err != nil {
		_ = v.Close()
		return nil, err
	}
	v.srv, v.sock = srv, sock
	go func() { _ = srv.Serve(context.Background(), l) }()
	req.Phase("spawn", time.Millisecond)
	d.t.Cleanup(func() { _ = v.Close() })
	return v, nil
}

type fakeVM struct {
	cmd    *exec.Cmd
	runDir string
	sock   string
	srv    interface{ Close() error }
	done   chan struct{}
	once   sync.Once
}

func (v *fakeVM) PID() int                           { return v.cmd.Process.Pid }
func (v *fakeVM) Resume(context.Context) error       { return nil }
func (v *fakeVM) Pause(context.Context) error        { return nil }
func (v *fakeVM) Shutdown(ctx context.Context) error { _ = v.Kill(); return v.Wait(ctx) }

func (v *fakeVM) Kill() error {
	if err := v.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (v *fakeVM) Wait(ctx context.Context) error {
	select {
	case <-v.done:
		return nil
	default:
	}
	select {
	case <-v.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *fakeVM) DialAgent(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", v.sock)
}

func (v *fakeVM) Close() error {
	var err error
	v.once.Do(func() {
		_ = v.Kill()
		<-v.done
		if v.srv != nil {
			_ = v.srv.Close()
		}
		err = os.RemoveAll(v.runDir)
	})
	return err
}

// nopSystem keeps the agent from changing the test machine's clock,
// entropy, hostname and sysctls; it records the hostname and sysctls asked
// for.
type nopSystem struct {
	mu       sync.Mutex
	hostname string
	sysctls  map[string]string
}

func (*nopSystem) KernelRelease() string   { return "test" }
func (*nopSystem) SetTime(time.Time) error { return nil }
func (*nopSystem) AddEntropy([]byte) error { return nil }
func (s *nopSystem) SetHostname(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hostname = name
	return nil
}
func (s *nopSystem) SetSysctl(key, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sysctls == nil {
		s.sysctls = map[string]string{}
	}
	s.sysctls[key] = value
	return nil
}
func (*nopSystem) Sync()           {}
func (*nopSystem) PowerOff() error { return nil }

func (s *nopSystem) sysctlsSet() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.sysctls)
}

func (s *nopSystem) name() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostname
}

// stageChain writes a one-link chain made "by" the fake hypervisor into a
// staged directory, as the snapshotter would.
func stageChain(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mem := filepath.Join(dir, "guest.mem")
	if err := os.WriteFile(mem, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	linkDir := filepath.Join(dir, "link")
	if err := os.Mkdir(linkDir, 0o700); err != nil {
		t.Fatal(err)
	}
	meta := chain.Meta{Hypervisor: "fake", HypervisorBuild: "fake 1", GuestOS: "linux", VCPUs: 1, PageSize: 4096}
	l, err := chain.WriteFull(context.Background(), mem, meta, linkDir)
	if err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(dir, "staged")
	if err := os.Mkdir(staged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStaged(staged, []*chain.Link{l}); err != nil {
		t.Fatal(err)
	}
	return staged
}
