package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// newSpecTask creates container id of image ref running `true` with opts
// applied to its spec, and its task.
func newSpecTask(ctx context.Context, t *testing.T, c *ctrdtest.Containerd, ref, id string, opts ...oci.SpecOpts) (client.Task, error) {
	t.Helper()
	cl := c.Client()
	img, err := cl.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	container, err := cl.NewContainer(ctx, id,
		client.WithSnapshotter(ctrdtest.Snapshotter),
		client.WithNewSnapshot(id, img),
		client.WithRuntime(runtimeName, nil),
		client.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs("true")}, opts...)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = container.Delete(context.Background(), client.WithSnapshotCleanup) })
	return container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &bytes.Buffer{}, &bytes.Buffer{}), cio.WithFIFODir(c.FifoDir)))
}

func withMount(m specs.Mount) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Mounts = append(s.Mounts, m)
		return nil
	}
}

// taskLeftovers is what a task left in the stack: processes (a task
// server, QEMU), task servers' sockets (not the spare's) and VM run dirs.
func taskLeftovers(c *ctrdtest.Containerd) []string {
	left := c.InUse()
	socks, _ := filepath.Glob(filepath.Join(c.Dir, "s", "*"))
	for _, s := range socks {
		if !strings.HasPrefix(filepath.Base(s), spare.SocketPrefix) {
			left = append(left, "socket "+s)
		}
	}
	runDirs, _ := filepath.Glob(filepath.Join(c.RunDir, ctrdtest.Namespace, "*"))
	for _, d := range runDirs {
		left = append(left, "run dir "+d)
	}
	return left
}

// noLeftovers waits for a failed or deleted task's shim to be gone (it
// exits once containerd has told it to) with everything it had.
func noLeftovers(t *testing.T, c *ctrdtest.Containerd) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "nothing left of the task", func() error {
		if left := taskLeftovers(c); len(left) > 0 {
			return fmt.Errorf("left: %v", left)
		}
		return nil
	})
}

// TestCreateRefusals: a spec asking for what a cocoon VM does not do fails
// the create with an error naming what and why — not the "service
// containerd.task.v2.Task" containerd printed when it took an Unimplemented
// answer for "task API v3 not served" — and leaves no task server, socket,
// QEMU or run dir behind. The image is an ordinary one: a snapshot image's
// guest keeps its own root and takes no spec mounts.
func TestCreateRefusals(t *testing.T) {
	c, _ := ordinaryStack(t, imageRef)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name string
		opt  oci.SpecOpts
		want string
	}{
		{"bind of a FIFO", withMount(specs.Mount{Destination: "/mnt/f", Type: "bind", Source: fifo, Options: []string{"rbind", "ro"}}), fifo},
		{"bind of /dev/zero", withMount(specs.Mount{Destination: "/mnt/z", Type: "bind", Source: "/dev/zero", Options: []string{"rbind"}}), "/dev/zero"},
		{"nfs mount", withMount(specs.Mount{Destination: "/mnt/n", Type: "nfs", Source: "server:/export"}), `"nfs"`},
		{"startContainer hook", withHooks(&specs.Hooks{StartContainer: []specs.Hook{{Path: "/bin/true"}}}), "startContainer hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := newSpecTask(ctx, t, c, ordinaryRef, fmt.Sprintf("refused-%d", i), tc.opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "task.v2") {
				t.Fatalf("create: %v, want an error naming %q", err, tc.want)
			}
			t.Logf("create refused: %v", err)
			noLeftovers(t, c)
		})
	}
}

// TestPoststopHookDeadline: a poststop hook that sets no timeout and never
// ends is killed at shim.hook_timeout; the delete returns then, and the
// task's shim goes.
func TestPoststopHookDeadline(t *testing.T) {
	const deadline = 3 * time.Second
	c := stack(t, fmt.Sprintf("[shim]\nhook_timeout = %q\n", deadline))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pidFile := filepath.Join(t.TempDir(), "hook.pid")
	hook := specs.Hook{Path: "/bin/sh", Args: []string{"sh", "-c", `echo $$ > "$0"; exec sleep 1000`, pidFile}}
	task, err := newSpecTask(ctx, t, c, imageRef, "poststop", withHooks(&specs.Hooks{Poststop: []specs.Hook{hook}}))
	if err != nil {
		t.Fatal(err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-exited
	began := time.Now()
	if _, err := task.Delete(ctx); err != nil {
		t.Fatalf("delete: %v", err)
	}
	took := time.Since(began)
	t.Logf("delete took %v with a poststop hook killed at %v", took, deadline)
	if took < deadline || took > deadline+time.Minute {
		t.Fatalf("delete took %v, want it to wait for the poststop hook's deadline %v, and not much longer", took, deadline)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the poststop hook did not run: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the hook killed", func() error {
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !slices.Contains(strings.Fields(string(stat)), "Z") {
			return fmt.Errorf("hook %d still runs", pid)
		}
		return nil
	})
	noLeftovers(t, c)
}

// TestTaskV2FallbackEndsServer: containerd's fallback after a task API v3
// Create answered Unimplemented — a v2 Create, then v2 Delete and Shutdown
// to clean up — made on a task server started as containerd starts one
// (the launcher's `start`, bootstrap parameters on stdin): the Create is
// refused saying why, and the clean-up ends the server and its socket.
// Before, v2 was not served at all and the server stayed for good.
func TestTaskV2FallbackEndsServer(t *testing.T) {
	c := ctrdtest.Start(t, ctrdtest.Options{})
	bundle := filepath.Join(c.State, "v2probe")
	addr := startServer(t, c, bundle, "v2probe")
	conn, err := net.Dial("unix", strings.TrimPrefix(addr, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	tc := ttrpc.NewClient(conn)
	defer tc.Close()
	v2 := taskv2.NewTTRPCTaskClient(tc)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ctrdtest.Namespace), time.Minute)
	defer cancel()
	_, err = v2.Create(ctx, &taskv2.CreateTaskRequest{ID: "v2probe", Bundle: bundle})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "task API v3") {
		t.Fatalf("v2 Create: %v, want FailedPrecondition saying cocoon serves task API v3", err)
	}
	if _, err := v2.Delete(ctx, &taskv2.DeleteRequest{ID: "v2probe"}); status.Code(err) != codes.NotFound {
		t.Fatalf("v2 Delete: %v, want NotFound", err)
	}
	if _, err := v2.Shutdown(ctx, &taskv2.ShutdownRequest{ID: "v2probe"}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
		t.Fatalf("v2 Shutdown: %v", err)
	}
	testenv.Eventually(t, 20*time.Second, "the task server and its socket gone", func() error {
		if left := taskLeftovers(c); len(left) > 0 {
			return fmt.Errorf("left: %v", left)
		}
		if _, err := os.Stat(strings.TrimPrefix(addr, "unix://")); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("socket %s: %v", addr, err)
		}
		return nil
	})
}

// startServer runs the launcher's `start` for task id in bundle as
// containerd 2.4 runs it, with the log FIFO containerd reads, and returns
// the task server's address.
func startServer(t *testing.T, c *ctrdtest.Containerd, bundle, id string) string {
	t.Helper()
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bundle) })
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.2.0"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	logFIFO := filepath.Join(bundle, "log")
	if err := syscall.Mkfifo(logFIFO, 0o600); err != nil {
		t.Fatal(err)
	}
	logs, err := os.OpenFile(logFIFO, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logs.Close() })
	socketDir := filepath.Join(c.Dir, "s")
	params, err := proto.Marshal(&bootapi.BootstrapParams{
		InstanceID: id, Namespace: ctrdtest.Namespace,
		ContainerdGrpcAddress: c.Address, ContainerdTtrpcAddress: c.Address + ".ttrpc", SocketDir: &socketDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.Bin(t, "containerd-shim-cocoon-v2"), "-namespace", ctrdtest.Namespace, "-id", id,
		"-address", c.Address, "-publish-binary", testenv.Bin(t, "containerd"), "start")
	cmd.Dir, cmd.Stdin = bundle, bytes.NewReader(params)
	cmd.Env = append(os.Environ(), "TTRPC_ADDRESS="+c.Address+".ttrpc", "GRPC_ADDRESS="+c.Address, "NAMESPACE="+ctrdtest.Namespace)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("launcher start: %v", err)
	}
	var result bootapi.BootstrapResult
	if err := proto.Unmarshal(out, &result); err != nil || result.Address == "" {
		t.Fatalf("launcher start printed %q (%v), want a bootstrap result", out, err)
	}
	return result.Address
}
