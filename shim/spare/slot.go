package spare

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/unixsock"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare/idle"
)

// replyTimeout bounds the wait for the spares' answers, all of those a
// launcher tries together; a launcher that gives up on one closes the
// connection, and the spare, seeing no go-ahead, exits.
const replyTimeout = 2 * time.Second

// goAhead tells a spare that answered to go on as the task's server.
var goAhead = []byte{'g'}

// MaxSpares bounds the spares of one containerd and server binary: a
// launcher looks for one in this many slots.
const MaxSpares = 16

// Claim hands req and the task's listening socket to a waiting spare of
// the containerd at containerdAddress running server, and returns its pid
// once it goes on as the task's server. It tries the spare that has waited
// longest first (waiting: its pooled VM is the likeliest to be warm); a
// launcher that finds a spare gone to another launcher of a burst tries
// the next. It returns 0 when no spare took the task, with the errors of
// those that failed or declined; either way the caller starts the server
// itself.
func Claim(socketDir, containerdAddress, server string, req Request, taskSocket *os.File) (int, error) {
	var errs []error
	deadline := time.Now().Add(replyTimeout)
	for _, path := range waiting(socketDir, containerdAddress, server) {
		if time.Until(deadline) <= 0 {
			break
		}
		pid, err := claimAt(path, req, taskSocket, deadline)
		if err != nil {
			errs = append(errs, err)
		}
		if pid != 0 {
			return pid, errors.Join(errs...)
		}
	}
	return 0, errors.Join(errs...)
}

// waiting lists the sockets in the slots, the longest published first (a
// spare renames its socket into the slot when it is up, which sets the
// socket's ctime).
func waiting(socketDir, containerdAddress, server string) []string {
	type slot struct {
		path  string
		since int64
	}
	var found []slot
	for i := range MaxSpares {
		path := Path(socketDir, containerdAddress, server, i)
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil {
			found = append(found, slot{path, st.Ctim.Nano()})
		}
	}
	slices.SortFunc(found, func(a, b slot) int { return cmp.Compare(a.since, b.since) })
	paths := make([]string, len(found))
	for i, s := range found {
		paths[i] = s.path
	}
	return paths
}

// claimAt hands the task to the spare at path, waiting for its answer
// until deadline. It returns 0 and no error when no spare waits there, or
// when the one there went to another launcher first (it closed its socket
// before answering).
func claimAt(path string, req Request, taskSocket *os.File, deadline time.Time) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("spare socket: %w", err)
	}
	defer unix.Close(fd)
	if err := ignoreEINTR(func() error { return unix.Connect(fd, &unix.SockaddrUnix{Name: path}) }); err != nil {
		return 0, nil
	}
	data, err := encode(req)
	if err != nil {
		return 0, err
	}
	if err := unix.Sendmsg(fd, data, unix.UnixRights(int(taskSocket.Fd())), nil, 0); err != nil {
		return 0, nil // gone meanwhile
	}
	tv := unix.NsecToTimeval(max(time.Until(deadline), time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("spare reply timeout: %w", err)
	}
	buf := make([]byte, 512)
	var n int
	err = ignoreEINTR(func() (err error) { n, err = unix.Read(fd, buf); return err })
	if n == 0 || errors.Is(err, unix.ECONNRESET) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("spare reply: %w", errors.Join(err, errDeclined))
	}
	var r reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return 0, fmt.Errorf("decode spare reply: %w", err)
	}
	if r.Error != "" || r.PID <= 0 {
		return 0, fmt.Errorf("%w: %s", errDeclined, r.Error)
	}
	if _, err := unix.Write(fd, goAhead); err != nil {
		return 0, fmt.Errorf("spare go-ahead: %w", err)
	}
	return r.PID, nil
}

// Refill puts spares of the server binary, with env, in the first count
// slots (MaxSpares at most) of the containerd at containerdAddress that
// have none waiting or starting. A task server calls it once its task is
// under way, so the spares' start-up stays off that task's path. A spare
// listens at its slot's pending path until its start-up is done and then
// moves to the slot's path, so a launcher never waits for a spare still
// starting.
func Refill(socketDir, containerdAddress, server string, count int, env []string) error {
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, ttrpcAddressEnv+"=") }) {
		// A spare could not tell when containerd stops.
		return nil
	}
	unlock, err := lockDir(socketDir)
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for slot := range min(count, MaxSpares) {
		errs = append(errs, refillSlot(Path(socketDir, containerdAddress, server, slot), server, env))
	}
	return errors.Join(errs...)
}

// refillSlot starts a spare at path unless one waits there or is starting;
// the caller holds the socket dir's lock.
func refillSlot(path, server string, env []string) error {
	pending := path + pendingSuffix
	if accepts(path) || accepts(pending) {
		return nil
	}
	for _, p := range []string{path, pending} {
		if err := removeIfExists(p); err != nil {
			return fmt.Errorf("remove stale spare socket: %w", err)
		}
	}
	l, err := unixsock.Listen(pending, unix.SOCK_SEQPACKET)
	if err != nil {
		return err
	}
	defer l.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return errors.Join(err, os.Remove(pending))
	}
	defer null.Close()
	// The spare's fd 3 holds a place for the task socket it gets later.
	// Forked under the normal policy: it demotes itself once it runs.
	p, err := os.StartProcess(server, []string{server, Flag, path}, &os.ProcAttr{
		Dir:   "/",
		Env:   idleEnv(env),
		Files: []*os.File{null, null, null, null, l},
		// Its own process group, so signals meant for containerd miss it.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	if err == nil {
		err = p.Release()
	}
	if err != nil {
		return errors.Join(fmt.Errorf("start spare: %w", err), os.Remove(pending))
	}
	return nil
}

// idleEnv is env with idle.Env set where the spare may return to the
// normal policy, so that it starts under SCHED_IDLE (package idle): its
// start-up (the cost a spare exists to take off the next task's path) then
// takes only CPU time nothing else wants, never the task just started.
// Where it could not return (no CAP_SYS_NICE and a low RLIMIT_NICE) it
// starts normally.
func idleEnv(env []string) []string {
	if !mayLeaveIdle() {
		return env
	}
	return append(slices.Clip(env), idle.Env+"=1")
}

// mayLeaveIdle reports whether a thread of this process under SCHED_IDLE
// may return to SCHED_OTHER: with CAP_SYS_NICE, or an RLIMIT_NICE that
// allows nice 0 (sched(7)).
func mayLeaveIdle() bool {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NICE, &lim) == nil && lim.Cur >= 20 {
		return true
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_NICE) != 0
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// accepts reports whether a spare (or a starting one) listens at path. A
// SOCK_SEQPACKET socket keeps each hand-over message whole.
func accepts(path string) bool { return unixsock.Accepts(path, unix.SOCK_SEQPACKET) }
