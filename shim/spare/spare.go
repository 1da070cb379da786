// Package spare keeps task servers started ahead of need, per containerd
// and server binary: one by default, as many as a burst of starts should
// find (Refill's count, shim.spares). Starting the full server binary
// costs ~4 ms of Go start-up here (page faults of a 30 MB binary, package
// init), on the path of every task start; a spare has paid it already. The
// launcher that starts a task hands a spare what a freshly spawned server
// would get — its arguments, environment, bundle dir and listening task
// socket — and the spare goes on as that server. The server then puts new
// spares in place, off the next task's path.
//
// A spare starts under SCHED_IDLE, off the CPUs the task just started needs,
// and waits on a SOCK_SEQPACKET unix socket in containerd's shim socket dir. It exits when containerd's ttrpc socket closes (containerd stopped),
// after an idle timeout, or after any failed hand-over; a spare of another
// binary than the one the launcher would run declines, so an upgrade never
// serves new tasks with old code. This package is imported by the launcher,
// whose start-up it must not slow: it uses only the standard library and
// x/sys/unix.
package spare

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare/idle"
)

// Flag, as the server binary's first argument, makes it a spare; the path
// of its socket follows (so that tools finding processes by the socket dir
// find spares too). Package idle, which this one imports, demotes a spare
// to SCHED_IDLE as its process starts.
const Flag = idle.Flag

// The spare's descriptors: the task socket goes where pkg/shim's server
// expects it, and the spare's own listener right after it.
const (
	taskSocketFD = 3
	listenerFD   = 4
)

// ttrpcAddressEnv is where containerd tells a shim its ttrpc address; a
// spare watches that socket.
const ttrpcAddressEnv = "TTRPC_ADDRESS"

// pendingSuffix names a spare's socket while it starts.
const pendingSuffix = ".pending"

// maxMessage bounds a hand-over request (arguments and environment).
const maxMessage = 1 << 20

// Request is what a launcher hands a spare: how the task server would have
// been started.
type Request struct {
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Exe is the server binary the launcher would start; a spare running
	// another file declines.
	Exe string `json:"exe"`
}

// reply is the spare's answer: its pid once it is the task's server.
type reply struct {
	PID   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// SocketPrefix begins the name of every spare's socket in a socket dir.
const SocketPrefix = "cocoon-spare-"

// IsWaiting reports whether the process with command line args and working
// dir cwd is a spare with no task yet. One that has a task keeps its
// command line but runs in the task's bundle.
func IsWaiting(args []string, cwd string) bool {
	return len(args) == 3 && args[1] == Flag && cwd == "/"
}

// Path is the socket of the spare in slot for the containerd at
// containerdAddress running server, in socketDir.
func Path(socketDir, containerdAddress, server string, slot int) string {
	d := sha256.Sum256([]byte("cocoon-spare\x00" + containerdAddress + "\x00" + server))
	name := SocketPrefix + hex.EncodeToString(d[:12])
	if slot > 0 {
		name += "-" + strconv.Itoa(slot)
	}
	return filepath.Join(socketDir, name)
}

// lockDir takes an exclusive flock on dir, serializing the changes to
// the spare sockets there (a refill's, a spare's publishing or removing
// its own); launchers claim spares without it.
func lockDir(dir string) (unlock func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	if err := ignoreEINTR(func() error { return unix.Flock(fd, unix.LOCK_EX) }); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// sameFile reports whether path is the file st describes.
func sameFile(path string, st *unix.Stat_t) bool {
	var cur unix.Stat_t
	return unix.Stat(path, &cur) == nil && cur.Dev == st.Dev && cur.Ino == st.Ino
}

func encode(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(data) > maxMessage {
		return nil, fmt.Errorf("hand-over message is %d bytes, more than %d", len(data), maxMessage)
	}
	return data, nil
}

// errDeclined is a spare's refusal, for a launcher to start a server itself.
var errDeclined = errors.New("spare declined")

// ignoreEINTR retries f while a signal interrupts it.
func ignoreEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
