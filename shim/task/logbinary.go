package task

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"time"
)

const (
	// loggerReadyTimeout bounds the wait for a logging binary to say it is ready.
	loggerReadyTimeout = 10 * time.Second
	// loggerExitTimeout lets a logging binary flush after its input ends.
	loggerExitTimeout = 10 * time.Second
)

// logger is a logging binary (a binary:// or binary-v2:// stdio URI, as
// ctr --log-uri and nerdctl use) fed a process's output: stdout on its fd 3,
// stderr on fd 4; it closes fd 5 (binary-v2: writes a byte first) when
// ready.
type logger struct {
	cmd            *exec.Cmd
	stdout, stderr *os.File
	exited         chan error
}

// startLogger runs the logging binary u names for the process of task id
// in namespace ns.
func startLogger(u *url.URL, id, ns string) (_ *logger, retErr error) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		files = append(files, r, w)
		return r, w, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("logger stdout pipe: %w", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("logger stderr pipe: %w", err)
	}
	readyR, readyW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("logger ready pipe: %w", err)
	}
	cmd := exec.Command(u.Path, loggerArgs(u)...)
	cmd.Env = append(os.Environ(), "CONTAINER_ID="+id, "CONTAINER_NAMESPACE="+ns)
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start logging binary %s: %w", u.Path, err)
	}
	l := &logger{cmd: cmd, stdout: outW, stderr: errW, exited: make(chan error, 1)}
	go func() { l.exited <- cmd.Wait() }()
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
			<-l.exited
		}
	}()
	readyW.Close()
	if err := waitReady(readyR, u.Scheme == "binary-v2"); err != nil {
		return nil, fmt.Errorf("logging binary %s: %w", u.Path, err)
	}
	files = []*os.File{readyR, outR, errR}
	return l, nil
}

// loggerArgs turns the URI's query into arguments, as containerd's shims do.
func loggerArgs(u *url.URL) []string {
	var args []string
	for k, vs := range u.Query() {
		args = append(args, k)
		if len(vs) > 0 {
			args = append(args, vs[0])
		}
	}
	return args
}

// waitReady waits for the binary to close its ready fd; binary-v2 must
// write a byte first, so a crash is not taken for readiness.
func waitReady(r *os.File, v2 bool) error {
	if err := r.SetReadDeadline(time.Now().Add(loggerReadyTimeout)); err != nil {
		return fmt.Errorf("ready pipe: %w", err)
	}
	n, err := r.Read(make([]byte, 1))
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("wait until ready: %w", err)
	}
	if v2 && n == 0 {
		return errors.New("exited or closed its ready fd without signalling ready")
	}
	return nil
}

// Close ends the binary's input and waits for it to flush and exit.
func (l *logger) Close() error {
	l.stdout.Close()
	l.stderr.Close()
	select {
	case <-l.exited:
		return nil
	case <-time.After(loggerExitTimeout):
		_ = l.cmd.Process.Kill()
		<-l.exited
		return fmt.Errorf("logging binary %s did not exit within %s after its input ended", l.cmd.Path, loggerExitTimeout)
	}
}
