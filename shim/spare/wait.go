package spare

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// IdleTimeout is how long a spare waits for a task before it exits.
var IdleTimeout = 10 * time.Minute

// Errors that end a spare without a task.
var (
	errIdle           = errors.New("no task came")
	errContainerdGone = errors.New("containerd closed its socket")
	// errProbe: a launcher checked that the spare is there, and hung up.
	errProbe = errors.New("probe")
	// errSilent: a client sent no request within requestTimeout.
	errSilent = errors.New("no request in time")
)

// Bounds on the waits for a client of the spare's socket. A launcher
// sends its request as soon as it connects: a client silent for
// requestTimeout is dropped, so it cannot hold the spare while launchers
// queue behind it; the bound is below the launcher's replyTimeout, so a
// launcher queued behind a silent client is still served. A launcher
// sends its go-ahead as soon as it has the spare's answer, and a spare
// that gave up waiting for it could lose a task the launcher counts as
// handed over: goAheadTimeout only ends a client that hung mid-way.
const (
	requestTimeout = time.Second
	goAheadTimeout = 30 * time.Second
)

// Wait runs this process as the spare for the slot at path (its listener,
// bound at the pending path, at fd 4) until a launcher hands it a task, and
// returns once the process is set up as that task's server: its arguments,
// environment and working dir are the ones the launcher gave, and the task
// socket is at fd 3. Any other outcome ends the spare: the error says why,
// and the caller exits. onReady, if set, runs once the spare is up (its
// start-up done, its threads back under the normal policy), while it
// waits.
func Wait(path string, onReady func()) error {
	var sock unix.Stat_t
	if err := unix.Stat(path+pendingSuffix, &sock); err != nil {
		return fmt.Errorf("spare socket: %w", err)
	}
	watch, err := ready(path, &sock)
	if err != nil {
		return errors.Join(err, remove(path, &sock))
	}
	if onReady != nil {
		onReady()
	}
	deadline := time.Now().Add(IdleTimeout)
	defer unix.Close(watch)
	defer unix.Close(listenerFD)
	for {
		c, err := awaitClaim(watch, deadline)
		if err != nil {
			return errors.Join(err, remove(path, &sock))
		}
		req, taskFD, err := receive(c)
		if errors.Is(err, errProbe) || errors.Is(err, errSilent) {
			unix.Close(c)
			continue
		}
		if err == nil {
			err = handover(c, req, taskFD)
		}
		unix.Close(c)
		if err != nil {
			// The launcher starts a server itself; the next refill would
			// replace this socket, but there may be none.
			return errors.Join(err, remove(path, &sock))
		}
		return nil
	}
}

// ready ends the spare's start-up: a garbage collection, back to the normal
// scheduling policy, a watch on containerd, and its socket moved from the pending path to the
// slot's, where launchers find it.
func ready(path string, sock *unix.Stat_t) (int, error) {
	collect()
	if err := normalPolicy(); err != nil {
		return -1, err
	}
	watch, err := watchContainerd(os.Getenv(ttrpcAddressEnv))
	if err != nil {
		return -1, err
	}
	unlock, err := lockDir(filepath.Dir(path))
	if err == nil {
		defer unlock()
		if !sameFile(path+pendingSuffix, sock) {
			err = errors.New("spare socket was replaced while the spare started")
		} else {
			err = os.Rename(path+pendingSuffix, path)
		}
	}
	if err != nil {
		unix.Close(watch)
		return -1, fmt.Errorf("publish spare: %w", err)
	}
	return watch, nil
}

// collect runs the collection pkg/shim's GOGC 40 would otherwise set off
// as the server starts, on the task's path, and then stops collecting
// while the spare waits: the heap it freed stays the process's, where a
// waiting collector would hand it back to the kernel and the task's first
// allocations would fault it in again. The server's start sets GOGC anew,
// its goal from this collection's heap.
func collect() {
	runtime.GC()
	debug.SetGCPercent(-1)
}

// normalPolicy puts every thread of the process back under SCHED_OTHER
// (the spare started under SCHED_IDLE); threads the runtime starts later
// inherit it from these.
func normalPolicy() error { return SetPolicy(os.Getpid(), unix.SCHED_NORMAL) }

// SetPolicy puts every thread of process pid under the scheduling policy
// policy (a pooled VM's hypervisor waits under SCHED_IDLE); a thread
// that ends meanwhile is skipped.
func SetPolicy(pid int, policy uint32) error {
	des, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return fmt.Errorf("list threads of %d: %w", pid, err)
	}
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: policy}
	var errs []error
	for _, de := range des {
		tid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetAttr(tid, attr, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("scheduling policy of thread %d: %w", tid, err))
		}
	}
	return errors.Join(errs...)
}

// watchContainerd connects to containerd's ttrpc socket; containerd sends
// nothing on it, so it turns readable only when containerd closes it.
func watchContainerd(address string) (int, error) {
	if address == "" {
		return -1, errors.New("no " + ttrpcAddressEnv + ": cannot tell when containerd stops")
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("containerd watch socket: %w", err)
	}
	if err := ignoreEINTR(func() error { return unix.Connect(fd, &unix.SockaddrUnix{Name: address}) }); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	return fd, nil
}

// awaitClaim waits for a launcher of this user to connect, until the idle
// timeout or containerd closing the watch socket.
func awaitClaim(watch int, deadline time.Time) (int, error) {
	fds := []unix.PollFd{{Fd: listenerFD, Events: unix.POLLIN}, {Fd: int32(watch), Events: unix.POLLIN}}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return -1, errIdle
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) || n == 0 {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("wait for a task: %w", err)
		}
		if fds[1].Revents != 0 {
			return -1, errContainerdGone
		}
		c, _, err := unix.Accept4(listenerFD, unix.SOCK_CLOEXEC)
		if err != nil {
			continue
		}
		if cred, err := unix.GetsockoptUcred(c, unix.SOL_SOCKET, unix.SO_PEERCRED); err != nil || int(cred.Uid) != os.Getuid() {
			unix.Close(c)
			continue
		}
		if err := receiveTimeout(c, requestTimeout); err != nil {
			unix.Close(c)
			return -1, err
		}
		return c, nil
	}
}

// handover takes the task from the launcher on c: it answers with its pid,
// and only on the launcher's go-ahead takes the task socket and the
// launcher's arguments, environment and dir — a launcher that gave up
// meanwhile starts a server itself, which must be the only one.
func handover(c int, req Request, taskFD int) error {
	defer unix.Close(taskFD)
	if err := checkExe(req.Exe); err != nil {
		return errors.Join(err, send(c, reply{Error: err.Error()}))
	}
	if err := send(c, reply{PID: os.Getpid()}); err != nil {
		return err
	}
	if err := receiveTimeout(c, goAheadTimeout); err != nil {
		return err
	}
	b := make([]byte, 1)
	var n int
	err := ignoreEINTR(func() (err error) { n, err = unix.Read(c, b); return err })
	if err != nil || n != 1 || b[0] != goAhead[0] {
		return fmt.Errorf("launcher gave no go-ahead: %w", errors.Join(err, errDeclined))
	}
	return become(req, taskFD)
}

// receive reads the launcher's request and the task socket it carries.
func receive(c int) (Request, int, error) {
	var req Request
	// The message's size first, so the buffer is no bigger than it: a
	// large allocation now would set off a collection as the server starts.
	var size int
	err := ignoreEINTR(func() (err error) { size, _, err = unix.Recvfrom(c, nil, unix.MSG_PEEK|unix.MSG_TRUNC); return err })
	if errors.Is(err, unix.EAGAIN) {
		return req, -1, errSilent
	}
	if err != nil {
		return req, -1, fmt.Errorf("receive task: %w", err)
	}
	if size > maxMessage {
		return req, -1, fmt.Errorf("task hand-over is %d bytes, more than %d", size, maxMessage)
	}
	buf := make([]byte, size)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(c, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return req, -1, fmt.Errorf("receive task: %w", err)
	}
	if n == 0 && oobn == 0 {
		return req, -1, errProbe
	}
	fds, err := rights(oob[:oobn])
	if err != nil {
		return req, -1, err
	}
	if len(fds) != 1 {
		closeAll(fds)
		return req, -1, fmt.Errorf("task hand-over carries %d descriptors, want 1 (the task socket)", len(fds))
	}
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		unix.Close(fds[0])
		return req, -1, fmt.Errorf("decode task hand-over: %w", err)
	}
	return req, fds[0], nil
}

// receiveTimeout bounds each later read on c by d: a read with nothing
// to read then fails with EAGAIN (and one a signal interrupts with EINTR,
// even under SA_RESTART).
func receiveTimeout(c int, d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if err := unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("bound the wait for the launcher: %w", err)
	}
	return nil
}

func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse task hand-over: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("parse task hand-over: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// checkExe declines a task for another server binary than this one (an
// upgrade replaced it since this spare started).
func checkExe(exe string) error {
	var want unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &want); err != nil {
		return fmt.Errorf("stat own binary: %w", err)
	}
	if !sameFile(exe, &want) {
		return fmt.Errorf("spare runs another binary than %s", exe)
	}
	return nil
}

// become makes this process what the launcher would have started.
func become(req Request, taskFD int) error {
	if err := normalPolicy(); err != nil {
		return err
	}
	if err := unix.Dup3(taskFD, taskSocketFD, 0); err != nil {
		return fmt.Errorf("take task socket: %w", err)
	}
	if err := os.Chdir(req.Dir); err != nil {
		return fmt.Errorf("enter bundle: %w", err)
	}
	os.Clearenv()
	for _, kv := range req.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if err := os.Setenv(k, v); err != nil {
				return fmt.Errorf("set %s: %w", k, err)
			}
		}
	}
	os.Args = req.Args
	return nil
}

func send(c int, r reply) error {
	data, err := encode(r)
	if err == nil {
		_, err = unix.Write(c, data)
	}
	if err != nil {
		return fmt.Errorf("answer launcher: %w", err)
	}
	return nil
}

// remove deletes the spare's socket, at the slot's path or still at the
// pending one, if it is still this spare's (sock), under the dir lock a
// refill takes to replace it.
func remove(path string, sock *unix.Stat_t) error {
	unlock, err := lockDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unlock()
	for _, p := range []string{path, path + pendingSuffix} {
		if sameFile(p, sock) {
			return os.Remove(p)
		}
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
