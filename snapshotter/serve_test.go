package snapshotter

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// The test binary re-executed with these variables set is a snapshotter
// daemon, so a test can SIGKILL it mid-flatten.
const (
	envServeRoot    = "COCOON_SNAPSHOTTER_TEST_ROOT"
	envServeAddress = "COCOON_SNAPSHOTTER_TEST_ADDRESS"
)

func TestMain(m *testing.M) {
	if root := os.Getenv(envServeRoot); root != "" {
		os.Exit(serveForTest(root, os.Getenv(envServeAddress)))
	}
	os.Exit(m.Run())
}

func serveForTest(root, address string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	sn, err := New(context.Background(), root)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	defer sn.Close()
	if err := Serve(ctx, sn, address); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

// daemon is the test binary serving root on a socket in a subprocess.
type daemon struct {
	cmd     *exec.Cmd
	address string
	done    chan error
}

// startDaemon starts the daemon with env added to its environment.
func startDaemon(t *testing.T, root, address string, env ...string) *daemon {
	t.Helper()
	removableAfter(t, root)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envServeRoot+"="+root, envServeAddress+"="+address), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	d := &daemon{cmd: cmd, address: address, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	waitSocket(t, address, d.done)
	return d
}

// waitSocket waits until the snapshotter accepts connections at address:
// the socket file shows at bind, a moment before it listens.
func waitSocket(t *testing.T, address string, exited <-chan error) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		if c, err := net.DialTimeout("unix", address, time.Second); err == nil {
			c.Close()
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("snapshotter exited before serving: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("snapshotter did not serve %s within 20s", address)
}

// dial returns a snapshots.Snapshotter speaking gRPC to address.
func dial(t *testing.T, address string) snapshots.Snapshotter {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", address, err)
	}
	t.Cleanup(func() { conn.Close() })
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "cocoon")
}

// serveInProcess serves a new snapshotter on a socket until the test ends.
func serveInProcess(t *testing.T) snapshots.Snapshotter {
	t.Helper()
	return serve(t, newSnapshotter(t, t.TempDir()))
}

// serve serves sn on a socket until the test ends and returns a client.
func serve(t *testing.T, sn *Snapshotter) snapshots.Snapshotter {
	t.Helper()
	address := filepath.Join(t.TempDir(), "sn.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sn, address) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if _, err := os.Stat(address); !os.IsNotExist(err) {
			t.Errorf("socket %s left after shutdown (err %v)", address, err)
		}
	})
	waitSocket(t, address, done)
	return dial(t, address)
}

func TestCommitRejectsBadLink(t *testing.T) {
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 50, 32, 2)
	other := makeChain(t, t.TempDir(), 51, 32, 1)
	sn := serveInProcess(t)
	base := importChain(t, sn, other, "other")

	tests := []struct {
		name   string
		parent string
		files  func(t *testing.T, dir string)
		why    string // in the error besides "not a valid snapshot link"
	}{
		{"diff without a parent", "", func(t *testing.T, dir string) { copyDir(t, fx.dirs[1], dir) }, ""},
		{"diff on the wrong parent", base, func(t *testing.T, dir string) { copyDir(t, fx.dirs[1], dir) }, ""},
		{"ordinary files on a link", base, func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("hi"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "every layer on a link must be one"},
		{"a full link on a link", base, func(t *testing.T, dir string) { copyDir(t, fx.dirs[0], dir) }, ""},
		{"memory.data one page short", "", func(t *testing.T, dir string) {
			copyDir(t, fx.dirs[0], dir)
			p := filepath.Join(dir, chain.DataFile)
			fi, _ := os.Stat(p)
			if err := os.Truncate(p, fi.Size()-page); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"memory.data corrupted", "", func(t *testing.T, dir string) {
			copyDir(t, fx.dirs[0], dir)
			f, err := os.OpenFile(filepath.Join(dir, chain.DataFile), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{0xff, 0x00, 0xff}, page+100); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"state file missing", "", func(t *testing.T, dir string) {
			copyDir(t, fx.dirs[0], dir)
			os.Remove(filepath.Join(dir, "qemu.state"))
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "extract-bad"
			labels := snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: "bad"})
			ms, err := sn.Prepare(ctx, key, tc.parent, labels)
			if err != nil {
				t.Fatal(err)
			}
			tc.files(t, mountDir(t, ms))
			err = sn.Commit(ctx, "bad", key)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not a valid snapshot link") || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("commit of a bad link: %v, want an invalid-argument error naming the bad link", err)
			}
			if n := strings.Count(err.Error(), "invalid argument"); n != 1 {
				t.Fatalf("commit error over gRPC says invalid argument %d times, want once: %v", n, err)
			}
			t.Logf("commit error: %v", err)
			if _, err := sn.Stat(ctx, "bad"); !errdefs.IsNotFound(err) {
				t.Errorf("a rejected link was published: Stat = %v", err)
			}
			if info, err := sn.Stat(ctx, key); err != nil || info.Kind != snapshots.KindActive {
				t.Errorf("after a rejected commit Stat(%s) = %+v, %v; want it still active", key, info, err)
			}
			if err := sn.Remove(ctx, key); err != nil {
				t.Errorf("remove the rejected snapshot: %v", err)
			}
		})
	}

	top := importChain(t, sn, fx, "good")
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatalf("the daemon stopped serving after bad commits: %v", err)
	}
	sameContent(t, filepath.Join(mountDir(t, ms), chain.StagedMemory), fx.mem)
}

func TestCrashMidFlattenRecovers(t *testing.T) {
	const pages = 1 << 15 // 128 MiB of memory, two thirds of it data
	ctx := context.Background()
	fx := makeChain(t, t.TempDir(), 60, pages, 1)
	root := t.TempDir()
	address := filepath.Join(t.TempDir(), "sn.sock")

	d := startDaemon(t, root, address)
	sn := dial(t, address)
	top := importChain(t, sn, fx, "layer")
	go sn.Prepare(ctx, "ctr", top) //nolint:errcheck // fails when the daemon dies
	waitForTempFlat(t, root)
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.done

	for _, name := range flatFiles(t, root) {
		if !chain.IsTemp(name) {
			t.Fatalf("a killed flatten left a visible file %s", name)
		}
	}
	if err := os.Remove(address); err != nil {
		t.Fatalf("the killed daemon's socket should remain: %v", err)
	}

	d = startDaemon(t, root, address)
	if files := flatFiles(t, root); len(files) != 0 {
		t.Errorf("restart left %v in the flat cache, want the temp file removed", files)
	}
	sn = dial(t, address)
	ms, err := sn.Prepare(ctx, "ctr", top)
	if err != nil {
		t.Fatalf("prepare after restart: %v", err)
	}
	sameContent(t, filepath.Join(mountDir(t, ms), chain.StagedMemory), fx.mem)

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-d.done; err != nil {
		t.Errorf("daemon exit after SIGTERM: %v, want clean", err)
	}
	if _, err := os.Stat(address); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after SIGTERM (err %v)", err)
	}
}

// waitForTempFlat waits until a flatten has started writing its temp file.
func waitForTempFlat(t *testing.T, root string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "a flatten writing its temp file", func() error {
		for _, name := range flatFiles(t, root) {
			if chain.IsTemp(name) {
				return nil
			}
			t.Fatalf("flatten finished (%s) before the test could kill it: make the chain bigger", name)
		}
		return errors.New("no flat file yet")
	})
}
