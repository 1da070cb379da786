package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// mkdirRefused is a profile that lets everything through but mkdir, which
// fails with EACCES: a root process with every capability it needs for a
// directory in /tmp then cannot make one, only because of the filter.
var mkdirRefused = func() specs.LinuxSeccomp {
	eacces := uint(13)
	return specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{specs.ArchX86_64},
		Syscalls: []specs.LinuxSyscall{{Names: []string{"mkdir", "mkdirat"}, Action: specs.ActErrno, ErrnoRet: &eacces}}}
}

// probe reports the process's seccomp mode and whether it can make a dir.
var probe = []string{"sh", "-c", "grep '^Seccomp:' /proc/self/status; mkdir /tmp/made 2>/dev/null && echo mkdir-ok || echo mkdir-refused"}

func writeProfile(t *testing.T, p specs.LinuxSeccomp) string {
	t.Helper()
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "profile.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSeccomp: a container in a VM of its own starts under its spec's
// seccomp filter — containerd's default (ctr's --seccomp) and a profile of
// its own — and so do its execs; without one it has none.
func TestSeccomp(t *testing.T) {
	c := stack(t, "")
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
	}{
		{"none", nil, []string{"Seccomp:\t0", "mkdir-ok"}},
		{"containerd's default", []string{"--seccomp"}, []string{"Seccomp:\t2", "mkdir-ok"}},
		{"a profile refusing mkdir", []string{"--seccomp", "--seccomp-profile", writeProfile(t, mkdirRefused())}, []string{"Seccomp:\t2", "mkdir-refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(c, append([]string{"--rm"}, tc.flags...), "sc", probe...)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
	t.Run("exec", func(t *testing.T) {
		if _, err := run(c, []string{"-d", "--seccomp", "--seccomp-profile", writeProfile(t, mkdirRefused())}, "sc-exec", "sleep", "600"); err != nil {
			t.Fatal(err)
		}
		defer removeTask(t, c, "sc-exec")
		out, err := c.Ctr(append([]string{"task", "exec", "--exec-id", "e1", "--fifo-dir", c.FifoDir, "sc-exec"}, probe...)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "mkdir-refused") {
			t.Errorf("the exec does not run under the container's filter:\n%s", out)
		}
	})
}

// TestSeccompRefusesWhatTheStartNeeds: a profile refusing a call the
// agent's start of the process makes under the filter fails the create,
// naming the call, and leaves no task.
func TestSeccompRefusesWhatTheStartNeeds(t *testing.T) {
	c := stack(t, "")
	p := specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"wait4"}, Action: specs.ActKillProcess}}}
	_, err := run(c, []string{"--rm", "--seccomp", "--seccomp-profile", writeProfile(t, p)}, "sc", "true")
	if err == nil || !strings.Contains(err.Error(), "seccomp profile refuses wait4") {
		t.Fatalf("ctr run: %v, want the create refused naming wait4", err)
	}
	if out, _ := c.Ctr("task", "ls"); strings.Contains(out, "sc") {
		t.Errorf("a task is left:\n%s", out)
	}
}
