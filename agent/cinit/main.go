package cinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Main runs the helper and never returns: the process becomes the
// container's (or the exec's) program, or exits 1 having said why on
// StatusFD (0 for a container deleted before its start).
func Main() {
	// The program is exec'd from this thread, which takes its mount
	// namespace (an exec's), credentials, capabilities and filter.
	runtime.LockOSThread()
	// Not dumpable, as runc's init: no process of the container may
	// ptrace it or open its /proc files before its exec (which resets it).
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	status := os.NewFile(StatusFD, "status")
	err := run(status)
	if errors.Is(err, errNoStart) {
		os.Exit(0)
	}
	_, _ = io.WriteString(status, err.Error())
	os.Exit(1)
}

// errNoStart is a container deleted before it was started.
var errNoStart = errors.New("no start")

// run returns only when the program could not be exec'd.
func run(status *os.File) error {
	for _, fd := range []int{ConfigFD, StatusFD, StartFD} {
		unix.CloseOnExec(fd)
	}
	cfg, err := readConfig()
	if err != nil {
		return err
	}
	if cfg.Init != nil {
		err = cfg.Init.make(cfg.Process.Cwd)
	} else {
		err = joinMounts()
	}
	if err != nil {
		return err
	}
	p := &cfg.Process
	path, err := p.confine()
	if err != nil {
		return err
	}
	if cfg.Init != nil {
		if err := awaitStart(status); err != nil {
			return err
		}
	}
	return p.exec(path)
}

func readConfig() (*Config, error) {
	f := os.NewFile(ConfigFD, "config")
	defer f.Close()
	var cfg Config
	if err := json.NewDecoder(f).Decode(&cfg); err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return &cfg, nil
}

// joinMounts enters the running container's mount namespace: the
// thread first leaves the file system context Go's threads share.
func joinMounts() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare file system context: %w", err)
	}
	if err := unix.Setns(MountFD, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("join the container's mount namespace: %w", err)
	}
	return unix.Close(MountFD)
}

// awaitStart says the container is made and waits for its start.
func awaitStart(status *os.File) error {
	if _, err := status.Write([]byte{Ready}); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	var b [1]byte
	n, err := os.NewFile(StartFD, "start").Read(b[:])
	if n == 0 {
		if err == nil || errors.Is(err, io.EOF) {
			return errNoStart
		}
		return fmt.Errorf("wait for start: %w", err)
	}
	return nil
}
