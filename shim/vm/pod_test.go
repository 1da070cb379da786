package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// TestPodGuestNamespaces: the host's namespace paths CRI gives a pod's
// container become the guest's: no network entry (the VM's is the pod's),
// IPC and UTS the VM's own, a shared PID namespace its holder's.
func TestPodGuestNamespaces(t *testing.T) {
	host := []specs.LinuxNamespace{
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: "/proc/10/ns/net"},
		{Type: specs.IPCNamespace, Path: "/proc/10/ns/ipc"},
		{Type: specs.UTSNamespace, Path: "/proc/10/ns/uts"},
		{Type: specs.PIDNamespace, Path: "/proc/10/ns/pid"},
	}
	own := []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}}
	for _, tc := range []struct {
		name      string
		in        []specs.LinuxNamespace
		holder    uint32
		want      []specs.LinuxNamespace
		sharedPID bool
	}{
		{"own namespaces", own, 0, own, false},
		{"first to share the PID namespace", host, 0, own, true},
		{"joins the holder's", host, 42, []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace, Path: "/proc/42/ns/pid"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pod{pidHolder: tc.holder}
			got, shared := p.guestNamespaces(tc.in)
			if !reflect.DeepEqual(got, tc.want) || shared != tc.sharedPID {
				t.Fatalf("got %v shared=%v, want %v shared=%v", got, shared, tc.want, tc.sharedPID)
			}
		})
	}
}

// TestPodHoldPIDs: the first sharing container holds the namespace until
// it is gone; another's leaving changes nothing.
func TestPodHoldPIDs(t *testing.T) {
	p := &pod{}
	p.holdPIDs(7)
	p.holdPIDs(9)
	p.unholdPIDs(9)
	if p.pidHolder != 7 {
		t.Fatalf("holder %d, want 7", p.pidHolder)
	}
	p.unholdPIDs(7)
	if p.pidHolder != 0 {
		t.Fatalf("holder %d after it left, want none", p.pidHolder)
	}
}

// TestPodClaim: slots go to one container each, come back when freed, and
// a full VM says how many it has.
func TestPodClaim(t *testing.T) {
	p := &pod{slots: make([]string, 2)}
	for i, id := range []string{"a", "b"} {
		if slot, err := p.claim(id); err != nil || slot != i {
			t.Fatalf("claim %s: slot %d, %v; want %d", id, slot, err, i)
		}
	}
	_, err := p.claim("c")
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "all 2 disk slots") {
		t.Fatalf("claim in a full VM: %v, want resource exhausted naming 2 slots", err)
	}
	p.free(0)
	if slot, err := p.claim("c"); err != nil || slot != 0 {
		t.Fatalf("claim after free: slot %d, %v; want 0", slot, err)
	}
}

// TestPodCheckMemory: a container may ask for up to the VM's memory; more
// fails naming both figures.
func TestPodCheckMemory(t *testing.T) {
	limit := func(n int64) *specs.LinuxResources {
		return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &n}}
	}
	p := &pod{memory: 256 << 20}
	for _, tc := range []struct {
		name string
		res  *specs.LinuxResources
		ok   bool
	}{
		{"no resources", nil, true},
		{"small", limit(32 << 20), true},
		{"the whole VM", limit(256 << 20), true},
		{"above the VM", limit(512 << 20), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.checkMemory("c", tc.res)
			if tc.ok != (err == nil) {
				t.Fatalf("checkMemory: %v, want ok=%v", err, tc.ok)
			}
			if err != nil && (!strings.Contains(err.Error(), "512MiB") || !strings.Contains(err.Error(), "256MiB")) {
				t.Fatalf("error %q names not both figures", err)
			}
		})
	}
}

// fakeStarter is a task.Guest that starts every process with pid.
type fakeStarter struct {
	task.Guest
	pid uint32
}

func (g fakeStarter) Exec(context.Context, task.ProcessSpec) (task.Started, error) {
	return task.Started{Pid: g.pid}, nil
}

// TestPauseGuestHoldsPIDs: the sandbox's process started in a PID
// namespace of its own (the pod's pause) holds the pod's shared one; an
// exec, or a pause in the VM's own namespace, does not.
func TestPauseGuestHoldsPIDs(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    task.ProcessSpec
		want uint32
	}{
		{"pause in its own namespace", task.ProcessSpec{ID: task.InitGuestID, OwnPIDNamespace: true}, 5},
		{"pause in the VM's namespace", task.ProcessSpec{ID: task.InitGuestID}, 0},
		{"an exec", task.ProcessSpec{ID: "exec-1", OwnPIDNamespace: true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pod{}
			g := pauseGuest{Guest: fakeStarter{pid: 5}, pod: p}
			if _, err := g.Exec(context.Background(), tc.p); err != nil {
				t.Fatal(err)
			}
			if p.pidHolder != tc.want {
				t.Fatalf("holder %d, want %d", p.pidHolder, tc.want)
			}
		})
	}
}

// TestLapWithin: a guest call's lap shows the guest's own steps as phases
// of their own and the call's rest under its name, adding up to the lap.
func TestLapWithin(t *testing.T) {
	c := &phaseClock{last: time.Now().Add(-100 * time.Millisecond)}
	c.lapWithin(PhaseContainer, []agent.Phase{{Name: "root", Duration: 30 * time.Millisecond}, {Name: "runc create", Duration: 20 * time.Millisecond}})
	var names []string
	var total time.Duration
	for _, p := range c.phases {
		names = append(names, p.Name)
		total += p.Duration.D()
	}
	if want := []string{PhaseContainer, "guest root", "guest runc create"}; !slices.Equal(names, want) {
		t.Fatalf("phases %v, want %v", names, want)
	}
	if rest := c.phases[0].Duration.D(); rest < 50*time.Millisecond || rest > time.Second {
		t.Errorf("the call's rest %v, want the lap less the guest's 50ms", rest)
	}
	if total < 100*time.Millisecond || c.phases[1].Duration.D() != 30*time.Millisecond {
		t.Errorf("phases %+v add up to %v, want the whole lap (over 100ms), the guest's as told", c.phases, total)
	}
}

// TestPodGuestSpecCopies: a container's copies count against its pod's
// VM: all it copies, its own part (a directory the pod already has is
// bound, not copied again), and where they are, to remove them if its
// create fails.
func TestPodGuestSpecCopies(t *testing.T) {
	host := t.TempDir()
	dir, file := filepath.Join(host, "empty-dir"), filepath.Join(host, "hosts")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &pod{dirs: newSharedDirs(podBindSources, nil), copies: testCopies()}
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/data", Type: "bind", Source: dir, Options: []string{"rbind", "rw"}},
		{Destination: "/etc/hosts", Type: "bind", Source: file, Options: []string{"rbind", "ro"}},
	}}
	own := copyUsage{files: 1, bytes: 20}
	first, err := p.guestSpec(task.LaunchRequest{ID: "a", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	want := memberCopies{all: copyUsage{files: 2, bytes: 20}, own: own, paths: []string{memberBindSources("a"), podBindSources + "/1"}}
	if !reflect.DeepEqual(first.copies, want) {
		t.Fatalf("the first container's copies: %+v, want %+v", first.copies, want)
	}
	p.dirs.keep(context.Background(), first.copied, first.files)
	second, err := p.guestSpec(task.LaunchRequest{ID: "b", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	want = memberCopies{all: own, own: own, paths: []string{memberBindSources("b")}}
	if !reflect.DeepEqual(second.copies, want) {
		t.Fatalf("the second container's copies: %+v, want %+v", second.copies, want)
	}
}
