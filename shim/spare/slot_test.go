package spare

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/shimtest"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// taskSocket listens where containerd would connect to a task server.
func taskSocket(t *testing.T, dir string) (string, *os.File) {
	t.Helper()
	addr := filepath.Join(dir, "task.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	t.Cleanup(func() { f.Close() })
	return addr, f
}

func claim(t *testing.T, dir, containerd string, req Request, sock *os.File) (int, error) {
	t.Helper()
	return Claim(dir, containerd, os.Args[0], req, sock)
}

// TestClaim hands a task to a spare: it goes on with the launcher's
// arguments, environment and dir, serving the task socket.
func TestClaim(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	_, spare := refill(t, dir, ctrd.Addr)
	bundle := t.TempDir()
	addr, sock := taskSocket(t, dir)
	env := append(os.Environ(), "COCOON_SPARE_TEST_MARK=handed")
	args := []string{os.Args[0], "-namespace", "ns", "-id", "t1"}
	pid, err := claim(t, dir, ctrd.Addr, Request{Args: args, Env: env, Dir: bundle, Exe: os.Args[0]}, sock)
	if err != nil || pid != spare {
		t.Fatalf("Claim = %d, %v; want the spare %d", pid, err, spare)
	}
	awaitServing(t, bundle)
	for file, want := range map[string]string{
		shimtest.PIDFile:  strconv.Itoa(spare),
		shimtest.ArgsFile: strings.Join(args, " "),
		shimtest.EnvFile:  "COCOON_SPARE_TEST_MARK=handed",
	} {
		data, err := os.ReadFile(filepath.Join(bundle, file))
		if err != nil || !slices.Contains(strings.Split(string(data), "\n"), want) {
			t.Fatalf("spare's %s = %q (%v), want a line %q", file, data, err, want)
		}
	}
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatalf("task socket not served: %v", err)
	}
	c.Close()
	if pid, err := claim(t, dir, ctrd.Addr, Request{Args: args, Env: env, Dir: bundle, Exe: os.Args[0]}, sock); pid != 0 || err != nil {
		t.Fatalf("second Claim = %d, %v; want no spare", pid, err)
	}
}

// TestBurstClaimsSpares: the launchers of a burst take one spare each,
// whichever slot they try first (here all the same: one process), and
// the one left without finds none and no error.
func TestBurstClaimsSpares(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	paths, spares := refillSlots(t, dir, ctrd.Addr, 3)
	if _, err := os.Stat(Path(dir, ctrd.Addr, os.Args[0], 3)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a spare beyond the count's 3 slots (stat: %v)", err)
	}
	type result struct {
		pid    int
		err    error
		bundle string
	}
	results := make(chan result, len(spares)+1)
	for i := range len(spares) + 1 {
		bundle := t.TempDir()
		_, sock := taskSocket(t, t.TempDir())
		args := []string{os.Args[0], "-id", "t" + strconv.Itoa(i)}
		go func() {
			pid, err := Claim(dir, ctrd.Addr, os.Args[0], Request{Args: args, Dir: bundle, Exe: os.Args[0]}, sock)
			results <- result{pid, err, bundle}
		}()
	}
	var got []int
	for range len(spares) + 1 {
		r := <-results
		if r.err != nil {
			t.Errorf("Claim: %v", r.err)
		}
		if r.pid != 0 {
			got = append(got, r.pid)
			awaitServing(t, r.bundle)
		}
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(spares))
	if !slices.Equal(got, want) {
		t.Fatalf("the burst's claims went to %v, want each of the spares %v (at %v) once", got, want, paths)
	}
}

// TestClaimTakesLongestWaiting: of two spares, a launch takes the one
// that has waited longer (the likelier to have its pooled VM warm),
// whichever slot it is in.
func TestClaimTakesLongestWaiting(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	paths, spares := refillSlots(t, dir, ctrd.Addr, 2)
	// Slot 1's spare published last; make slot 0's the newer one.
	time.Sleep(10 * time.Millisecond)
	if err := os.Rename(paths[0], paths[0]+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(paths[0]+".moved", paths[0]); err != nil {
		t.Fatal(err)
	}
	_, sock := taskSocket(t, dir)
	bundle := t.TempDir()
	pid, err := claim(t, dir, ctrd.Addr, Request{Args: []string{os.Args[0]}, Dir: bundle, Exe: os.Args[0]}, sock)
	if err != nil || pid != spares[1] {
		t.Fatalf("Claim = %d, %v; want slot 1's spare %d, waiting longer than slot 0's %d", pid, err, spares[1], spares[0])
	}
	awaitServing(t, bundle)
}

// TestClaimWithoutSpare: no spare, no error; the launcher starts a server.
func TestClaimWithoutSpare(t *testing.T) {
	dir := socketDir(t)
	_, sock := taskSocket(t, dir)
	if pid, err := claim(t, dir, "/run/none.sock", Request{Exe: os.Args[0]}, sock); pid != 0 || err != nil {
		t.Fatalf("Claim = %d, %v; want 0, nil", pid, err)
	}
}

// TestSpareDeclinesOtherBinary: a spare of another binary than the one the
// launcher would run (an upgrade replaced it) declines and exits.
func TestSpareDeclinesOtherBinary(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	path, _ := refill(t, dir, ctrd.Addr)
	_, sock := taskSocket(t, dir)
	pid, err := claim(t, dir, ctrd.Addr, Request{Args: []string{"/bin/true"}, Dir: t.TempDir(), Exe: "/bin/true"}, sock)
	if pid != 0 || !errors.Is(err, errDeclined) {
		t.Fatalf("Claim = %d, %v; want a refusal", pid, err)
	}
	awaitGone(t, path)
}

// TestSpareOutlivesProbe: a launcher's check that a spare is there does not
// use it up.
func TestSpareOutlivesProbe(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	path, spare := refill(t, dir, ctrd.Addr)
	for range 3 {
		if !accepts(path) {
			t.Fatal("spare gone after a probe")
		}
	}
	_, sock := taskSocket(t, dir)
	bundle := t.TempDir()
	if pid, err := claim(t, dir, ctrd.Addr, Request{Args: []string{os.Args[0]}, Dir: bundle, Exe: os.Args[0]}, sock); pid != spare || err != nil {
		t.Fatalf("Claim after probes = %d, %v; want %d", pid, err, spare)
	}
	awaitServing(t, bundle)
}

// awaitServing waits until a spare handed a task in bundle has written its
// record there (its pid last), so no write races the bundle's removal.
func awaitServing(t *testing.T, bundle string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the spare's record in "+bundle, func() error {
		_, err := os.Stat(filepath.Join(bundle, shimtest.PIDFile))
		return err
	})
}

// TestRefillKeepsOneSpare: refills while a spare waits or starts add none.
func TestRefillKeepsOneSpare(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	path, _ := refill(t, dir, ctrd.Addr)
	for range 3 {
		if err := Refill(dir, ctrd.Addr, os.Args[0], 1, os.Environ()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(processesNaming(path)); n != 1 {
		t.Fatalf("%d spares after refills, want 1", n)
	}
}

// TestSpareEnds: a spare exits, removing its socket, when containerd closes
// its socket or when no task comes in time.
func TestSpareEnds(t *testing.T) {
	tests := []struct {
		name string
		idle string
		end  func(*shimtest.Containerd)
	}{
		{"containerd stops", "", (*shimtest.Containerd).Stop},
		{"idle", "1s", func(*shimtest.Containerd) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(timeoutEnv, tt.idle)
			dir := socketDir(t)
			ctrd := newFakeContainerd(t, dir)
			path, _ := refill(t, dir, ctrd.Addr)
			tt.end(ctrd)
			awaitGone(t, path)
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("spare left its socket (stat: %v)", err)
			}
		})
	}
}

// TestRefillNeedsContainerd: without containerd's ttrpc address a spare
// could not tell when to go, so none starts.
func TestRefillNeedsContainerd(t *testing.T) {
	dir := socketDir(t)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, ttrpcAddressEnv+"=") })
	if err := Refill(dir, "/run/c.sock", os.Args[0], 1, env); err != nil {
		t.Fatal(err)
	}
	if des, _ := os.ReadDir(dir); len(des) > 0 {
		t.Fatalf("Refill without %s made %s", ttrpcAddressEnv, des[0].Name())
	}
}

// TestRefillReplacesDeadSpare: a spare killed while it waits leaves its
// socket; a launcher finds no one there, and the next refill replaces it.
func TestRefillReplacesDeadSpare(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	path, dead := refill(t, dir, ctrd.Addr)
	if err := unix.Kill(dead, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The spare is this test's child: reaping it means it has closed its
	// socket (a dying process loses its command line before its files).
	var ws unix.WaitStatus
	if _, err := unix.Wait4(dead, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a killed spare's socket is gone (stat: %v); want it left stale", err)
	}
	_, sock := taskSocket(t, dir)
	if pid, err := claim(t, dir, ctrd.Addr, Request{Exe: os.Args[0]}, sock); pid != 0 || err != nil {
		t.Fatalf("Claim of a dead spare = %d, %v; want 0, nil", pid, err)
	}
	if _, pid := refill(t, dir, ctrd.Addr); pid == dead {
		t.Fatal("refill kept the dead spare")
	}
}

// TestSpareDropsSilentClient: a client that connects to a spare and says
// nothing does not hold it: a launcher's hand-over behind it is served
// within the launcher's reply timeout, by the same spare.
func TestSpareDropsSilentClient(t *testing.T) {
	dir := socketDir(t)
	ctrd := newFakeContainerd(t, dir)
	path, spare := refill(t, dir, ctrd.Addr)
	silent, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(silent) })
	if err := unix.Connect(silent, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	_, sock := taskSocket(t, dir)
	bundle := t.TempDir()
	start := time.Now()
	pid, err := claim(t, dir, ctrd.Addr, Request{Args: []string{os.Args[0]}, Dir: bundle, Exe: os.Args[0]}, sock)
	if pid != spare || err != nil {
		t.Fatalf("Claim behind a silent client = %d, %v after %s; want the spare %d", pid, err, time.Since(start), spare)
	}
	t.Logf("served after %s behind the silent client", time.Since(start))
	awaitServing(t, bundle)
}
