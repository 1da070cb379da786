package network

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// refuseHostEnv makes the test binary a process that runs Open and
// RefuseHost on each path its arguments name and prints one line per
// path: the path, a tab, and "ok" or the error. Set to "init", the
// process is the init of a PID namespace of its own and mounts its /proc.
const refuseHostEnv = "COCOON_NETWORK_TEST_REFUSE_HOST"

func TestMain(m *testing.M) {
	mode := os.Getenv(refuseHostEnv)
	if mode == "" {
		os.Exit(m.Run())
	}
	if mode == "init" {
		if err := mountProc(); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
	}
	for _, p := range os.Args[1:] {
		fmt.Printf("%s\t%s\n", p, refuseHost(p))
	}
}

// mountProc mounts a /proc of this process's PID namespace, in its mount
// namespace, made private first so the host's /proc stays as it is.
func mountProc() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	return nil
}

func refuseHost(path string) string {
	n, err := Open(path)
	if err != nil {
		return err.Error()
	}
	defer n.Close()
	if err := n.RefuseHost(); err != nil {
		return err.Error()
	}
	return "ok"
}

// TestRefuseHost: init's namespace and that of the process doing the
// check are refused, by what they are, not by their paths; any other is
// accepted. The checking process runs in a namespace the test made, which
// so stands in for the shim's own; as the init of a PID namespace of its
// own, it stands in for init too. Its fd 3 is that namespace, fd 4 another.
func TestRefuseHost(t *testing.T) {
	own, other := newNS(t), newNS(t)
	host := func(p string) string { return "is " + p + ": " + ErrHostNamespace.Error() }
	tests := []struct {
		mode  string
		clone uintptr
		want  map[string]string
	}{
		{"self", 0, map[string]string{
			"/proc/self/fd/3": host("/proc/self/ns/net"), "/proc/self/fd/4": "ok",
			"/proc/self/ns/net": host("/proc/self/ns/net"),
		}},
		{"init", unix.CLONE_NEWPID | unix.CLONE_NEWNS, map[string]string{
			"/proc/self/fd/3": host("/proc/1/ns/net"), "/proc/self/fd/4": "ok",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			var args []string
			for p := range tc.want {
				args = append(args, p)
			}
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), refuseHostEnv+"="+tc.mode)
			cmd.ExtraFiles = []*os.File{own.File(), other.File()}
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: tc.clone}
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := own.Do(cmd.Run); err != nil {
				t.Fatalf("checking process: %v\n%s", err, out.String())
			}
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				p, res, _ := strings.Cut(line, "\t")
				got[p] = res
			}
			for p, w := range tc.want {
				if !strings.HasSuffix(got[p], w) {
					t.Errorf("RefuseHost of %s: %q, want one ending in %q", p, got[p], w)
				}
			}
		})
	}
}

// TestRefuseHostInProcess: in this process, its own namespace is refused
// with ErrHostNamespace, a new one is not.
func TestRefuseHostInProcess(t *testing.T) {
	self, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if err := self.RefuseHost(); !errors.Is(err, ErrHostNamespace) {
		t.Errorf("RefuseHost of the own namespace: %v, want ErrHostNamespace", err)
	}
	if err := newNS(t).RefuseHost(); err != nil {
		t.Errorf("RefuseHost of a new namespace: %v", err)
	}
}
