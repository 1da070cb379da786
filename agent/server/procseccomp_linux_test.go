package server

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// firstForkChildEnv names the shell a test child runs as its first fork.
const firstForkChildEnv = "COCOON_TEST_FIRST_FORK_CHILD"

// TestFirstForkIntoOwnPIDNamespace: the first process an agent forks (as
// in a restored pod VM, whose pause process is its first) may have a
// seccomp filter and a PID namespace of its own: it is that namespace's
// pid 1, though os's one-time pidfd check forks too.
func TestFirstForkIntoOwnPIDNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), firstForkChildEnv+"="+testenv.LookPath(t, "sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("first-fork child: %v\n%s", err, out)
	}
}

// firstForkChild runs in the child, whose process has forked nothing yet.
func firstForkChild(sh string) int {
	profile, _ := json.Marshal(specs.LinuxSeccomp{DefaultAction: specs.ActAllow})
	svc := New(&fakeSystem{j: &journal{}})
	out, err := runIn(svc, &api.ExecRequest{Id: "pause", Args: []string{sh, "-c", "echo $$"}, Cwd: "/", OwnPidNamespace: true, Seccomp: profile})
	if err != nil || out != "1\n" {
		fmt.Printf("the first fork, into a PID namespace of its own under a filter: %q %v, want pid 1\n", out, err)
		return 1
	}
	return 0
}
