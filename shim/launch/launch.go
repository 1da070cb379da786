// Package launch is the shim's `start`: it puts a task in its group's shim
// socket and starts the long-running task server behind it — a waiting
// spare when there is one (package spare), else a new process — and
// returns the socket's address for containerd. Task servers refill the
// spare (RefillSpare).
//
// It runs in the launcher, the small binary containerd executes for every
// task start, on the path of every restore: like package spare it uses
// only the standard library, x/sys/unix and protowire, so the launcher
// starts in about a millisecond where the full shim takes four.
package launch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// The shim's two binaries, installed side by side: the launcher containerd
// runs, and the task server.
const (
	LauncherName = "containerd-shim-cocoon-v2"
	ServerName   = "cocoon-shim-server"
)

// DefaultSocketDir is containerd's shim socket dir when its bootstrap
// parameters name none (containerd's defaults.DefaultStateDir + "/s").
const DefaultSocketDir = "/run/containerd/s"

// serverEnv is added to the task server's environment: it needs few
// threads, and a VM's CPUs are QEMU's, not the shim's.
const serverEnv = "GOMAXPROCS=2"

// Request is one task to start a server for.
type Request struct {
	ID        string
	Namespace string
	// Containerd is containerd's gRPC address, part of the socket's name.
	Containerd string
	// SocketDir is where shim sockets go; DefaultSocketDir when empty.
	SocketDir string
	Debug     bool
	// Server is the task server binary.
	Server string
}

// Start puts task r in its group's shim socket, in the bundle (the working
// dir) as containerd runs `start`, and returns the socket's address: the
// running server's when the group has one, else a new socket with a server
// started behind it.
func Start(r Request) (string, error) {
	group, err := groupOf(r.ID, "config.json")
	if err != nil {
		return "", err
	}
	if r.SocketDir == "" {
		r.SocketDir = DefaultSocketDir
	}
	path := socketPath(r.SocketDir, r.Containerd, r.Namespace, group)
	addr := "unix://" + path
	sock, err := listen(path)
	if errors.Is(err, errServed) {
		return addr, nil
	}
	if err != nil {
		return "", err
	}
	defer sock.Close()
	pid, err := startServer(r, sock)
	if err != nil {
		return "", errors.Join(err, os.Remove(path))
	}
	if err := adjustOOMScore(pid); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return "", errors.Join(err, os.Remove(path))
	}
	return addr, nil
}

// socketPath is the shim socket of group, named as containerd's pkg/shim
// names it (CreateSocketAddress), so containerd and `shim delete` find it.
func socketPath(socketDir, containerd, namespace, group string) string {
	d := sha256.Sum256([]byte(filepath.Join(containerd, namespace, group)))
	return filepath.Join(socketDir, hex.EncodeToString(d[:]))
}

// startServer starts the task server on sock: the spare when one waits,
// else a new process. The server puts a new spare in place once its task
// is under way.
func startServer(r Request, sock *os.File) (int, error) {
	dir, err := os.Getwd()
	if err != nil {
		return 0, fmt.Errorf("find bundle: %w", err)
	}
	args := serverArgs(r)
	env := serverEnviron()
	pid, err := spare.Claim(r.SocketDir, r.Containerd, r.Server, spare.Request{Args: args, Env: env, Dir: dir, Exe: r.Server}, sock)
	if err != nil {
		warn(r.ID, "a spare shim server failed", err)
	}
	if pid != 0 {
		return pid, nil
	}
	return spawn(r.Server, args, env, dir, sock)
}

// serverEnviron is this process's environment with serverEnv in place of
// any value it had (a process takes the first of duplicate keys).
func serverEnviron() []string {
	key, _, _ := strings.Cut(serverEnv, "=")
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
	return append(env, serverEnv)
}

// serverArgs are the task server's arguments, as pkg/shim parses them.
func serverArgs(r Request) []string {
	args := []string{r.Server, "-namespace", r.Namespace, "-id", r.ID, "-address", r.Containerd}
	if r.Debug {
		args = append(args, "-debug")
	}
	return args
}

// spawn starts a new task server with the task socket at fd 3, in its own
// process group so signals meant for containerd miss it.
func spawn(server string, args, env []string, dir string, sock *os.File) (int, error) {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("start shim server: %w", err)
	}
	defer null.Close()
	p, err := os.StartProcess(server, args, &os.ProcAttr{
		Dir: dir, Env: env,
		Files: []*os.File{null, null, null, sock},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return 0, fmt.Errorf("start shim server: %w", err)
	}
	pid := p.Pid
	return pid, p.Release()
}

// adjustOOMScore puts the server one above its launcher's parent
// (containerd), as pkg/shim does, so the OOM killer takes a shim before
// containerd.
func adjustOOMScore(pid int) error {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", os.Getppid()))
	if err != nil {
		return fmt.Errorf("get parent OOM score: %w", err)
	}
	score, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("parse parent OOM score %q: %w", data, err)
	}
	score = min(score+1, 1000)
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(score)), 0); err != nil {
		return fmt.Errorf("set shim OOM score: %w", err)
	}
	return nil
}

// RefillSpare puts spares in place for the next tasks of the containerd
// at containerdAddress (package spare: count of them), from a task server
// whose task is under way: the server's binary, environment with set's
// "KEY=VALUE" entries in place of its own, and socket dir (the bundle's
// link, which `start` made, in the working dir).
func RefillSpare(containerdAddress string, count int, set ...string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find shim binary: %w", err)
	}
	socketDir, err := os.Readlink(socketDirLink)
	if err != nil {
		socketDir = DefaultSocketDir
	}
	return spare.Refill(socketDir, containerdAddress, self, count, withEnv(os.Environ(), set))
}

// withEnv is env with set's entries in place of those of their keys.
func withEnv(env, set []string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		key, _, _ := strings.Cut(kv, "=")
		return slices.ContainsFunc(set, func(s string) bool { return strings.HasPrefix(s, key+"=") })
	})
	return append(out, set...)
}
