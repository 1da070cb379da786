package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// script writes an executable /bin/sh script with body and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hook")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func seconds(n int) *int { return &n }

var testState = State("ctr-1", "/run/bundle", specs.StateCreating, 4242, map[string]string{"io.example/a": "b"})

// TestRunOrder: each hook runs once, in order, and the first failure
// stops the rest.
func TestRunOrder(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	logger := script(t, `echo "$1" >> "$LOG"; exit "$2"`)
	hook := func(name, exit string) specs.Hook {
		return specs.Hook{Path: logger, Args: []string{"logger", name, exit}, Env: []string{"LOG=" + log}}
	}
	tests := []struct {
		name  string
		hooks []specs.Hook
		log   string
		err   string
	}{
		{name: "all succeed", hooks: []specs.Hook{hook("a", "0"), hook("b", "0"), hook("c", "0")}, log: "a\nb\nc\n"},
		{name: "the second fails", hooks: []specs.Hook{hook("a", "0"), hook("b", "1"), hook("c", "0")}, log: "a\nb\n", err: "poststop hook 1 (" + logger + "): exited with status 1"},
		{name: "none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(log)
			err := Run(context.Background(), Poststop, tc.hooks, testState, time.Minute)
			checkErr(t, err, tc.err)
			got, _ := os.ReadFile(log)
			if string(got) != tc.log {
				t.Errorf("hooks ran %q, want %q", got, tc.log)
			}
		})
	}
}

// TestRunState: the hook reads exactly the OCI state JSON on its stdin.
func TestRunState(t *testing.T) {
	out := filepath.Join(t.TempDir(), "state.json")
	h := specs.Hook{Path: script(t, `cat > "$OUT"`), Env: []string{"OUT=" + out}}
	if err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, testState, time.Minute); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var got specs.State
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("stdin is not state JSON: %v: %s", err, raw)
	}
	want := specs.State{Version: specs.Version, ID: "ctr-1", Status: "creating", Pid: 4242, Bundle: "/run/bundle", Annotations: map[string]string{"io.example/a": "b"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("state on stdin = %+v, want %+v", got, want)
	}
	if !bytes.Contains(raw, []byte(`"ociVersion":"`+specs.Version+`"`)) {
		t.Errorf("state JSON %s lacks ociVersion", raw)
	}
}

// TestRunArgsEnv: the hook's argv (argv0 included) and environment are
// exactly the hook's Args and Env, and nothing is inherited.
func TestRunArgsEnv(t *testing.T) {
	dir := t.TempDir()
	cmdline, environ := filepath.Join(dir, "cmdline"), filepath.Join(dir, "environ")
	body := `cat /proc/$$/cmdline > "$1"; cat /proc/$$/environ > "$2"`
	t.Setenv("COCOON_HOOKS_TEST_LEAK", "1")
	tests := []struct {
		name string
		args []string
		env  []string
	}{
		{name: "args and env", args: []string{"my-argv0", "-c", body, "x", cmdline, environ}, env: []string{"B=two words", "A=1", "EMPTY="}},
		{name: "no env", args: []string{"sh", "-c", body, "x", cmdline, environ}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := specs.Hook{Path: "/bin/sh", Args: tc.args, Env: tc.env}
			if err := Run(context.Background(), CreateContainer, []specs.Hook{h}, testState, time.Minute); err != nil {
				t.Fatal(err)
			}
			if got := nulList(t, cmdline); !slices.Equal(got, tc.args) {
				t.Errorf("argv = %q, want %q", got, tc.args)
			}
			if got := nulList(t, environ); !slices.Equal(got, tc.env) {
				t.Errorf("environment = %q, want %q", got, tc.env)
			}
		})
	}
}

// TestRunFailures: every way a hook can fail fails Run with an error that
// names the hook, says how it ended and carries its output.
func TestRunFailures(t *testing.T) {
	ok := specs.Hook{Path: script(t, "exit 0")}
	tests := []struct {
		name string
		hook specs.Hook
		want []string
		max  int // bound on the error's length, when set
	}{{
		name: "non-zero exit",
		hook: specs.Hook{Path: script(t, "echo out-text; echo err-text >&2; exit 3")},
		want: []string{"exited with status 3", `stdout: "out-text\n"`, `stderr: "err-text\n"`},
	}, {
		name: "killed by a signal",
		hook: specs.Hook{Path: script(t, "kill -TERM $$")},
		want: []string{"killed by signal terminated"},
	}, {
		name: "missing program",
		hook: specs.Hook{Path: "/nonexistent/hook"},
		want: []string{"start: fork/exec /nonexistent/hook: no such file or directory"},
	}, {
		name: "long output keeps the end",
		hook: specs.Hook{Path: script(t, "head -c 100000 /dev/zero | tr '\\0' x; echo; echo last-line; exit 1")},
		want: []string{"bytes dropped", `last-line\n"`},
		max:  3 * outputLimit,
	}, {
		name: "relative path",
		hook: specs.Hook{Path: "hook"},
		want: []string{"invalid path: want an absolute path"},
	}, {
		name: "zero timeout",
		hook: specs.Hook{Path: ok.Path, Timeout: seconds(0)},
		want: []string{"invalid timeout 0"},
	}, {
		// 2^40 seconds overflows a time.Duration into a past deadline.
		name: "timeout of 2^40 seconds",
		hook: specs.Hook{Path: ok.Path, Timeout: seconds(1 << 40)},
		want: []string{"invalid timeout 1099511627776: want a positive number of seconds, at most 86400 (a day)"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), CreateRuntime, []specs.Hook{ok, tc.hook}, testState, time.Minute)
			want := append([]string{"createRuntime hook 1 (" + tc.hook.Path + "): "}, tc.want...)
			for _, w := range want {
				checkErr(t, err, w)
			}
			if err != nil && tc.max > 0 && len(err.Error()) > tc.max {
				t.Errorf("error is %d bytes, want at most %d", len(err.Error()), tc.max)
			}
		})
	}
}

// TestRunValidatesFirst: an invalid hook anywhere in the list means no
// hook runs.
func TestRunValidatesFirst(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	first := specs.Hook{Path: script(t, `touch "$1"`), Args: []string{"hook", marker}}
	err := Run(context.Background(), Prestart, []specs.Hook{first, {Path: "/bin/true", Timeout: seconds(-1)}}, testState, time.Minute)
	checkErr(t, err, "prestart hook 1 (/bin/true): invalid timeout -1")
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a hook ran before validation failed (%v)", err)
	}
}

// TestRunKills: a hook that outlives its timeout or ctx is killed with
// everything it started, and the error says why.
func TestRunKills(t *testing.T) {
	tests := []struct {
		name     string
		timeout  *int
		deadline time.Duration
		cancel   bool
		want     string
	}{
		{name: "timeout", timeout: seconds(1), deadline: time.Minute, want: "killed: timed out after 1s"},
		{name: "no timeout, the deadline", deadline: time.Second, want: "killed: it sets no timeout and ran past the runtime's deadline for such hooks (1s, shim.hook_timeout)"},
		{name: "its timeout beats the deadline", timeout: seconds(1), deadline: time.Hour, want: "killed: timed out after 1s"},
		{name: "context canceled", deadline: time.Minute, cancel: true, want: "killed: context canceled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pids := filepath.Join(t.TempDir(), "pids")
			// The child keeps the hook's stdout open too.
			h := specs.Hook{
				Path:    script(t, `sleep 1000 & echo $$ $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`),
				Args:    []string{"hook", pids},
				Timeout: tc.timeout,
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() {
					// Cancel by then at the latest: a hook that never
					// writes its pids fails the test instead of hanging it.
					waitFile(pids, 10*time.Second)
					cancel()
				}()
			}
			began := time.Now()
			err := Run(ctx, Poststart, []specs.Hook{h}, testState, tc.deadline)
			checkErr(t, err, "poststart hook 0 ("+h.Path+"): "+tc.want)
			if took := time.Since(began); !tc.cancel && took > 30*time.Second {
				t.Errorf("Run took %v, want about 1s", took)
			}
			if tc.cancel && !errors.Is(err, context.Canceled) {
				t.Errorf("error %v does not wrap context.Canceled", err)
			}
			for _, pid := range readPids(t, pids) {
				waitDead(t, pid)
			}
		})
	}
}

// TestRunDaemon: a successful hook may leave a daemon that holds its
// output open; Run returns instead of waiting for it.
func TestRunDaemon(t *testing.T) {
	pids := filepath.Join(t.TempDir(), "pids")
	h := specs.Hook{Path: script(t, `setsid sleep 1000 & echo $! > "$1"; echo started`), Args: []string{"hook", pids}}
	err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, testState, time.Minute)
	daemon := readPids(t, pids)
	t.Cleanup(func() {
		for _, pid := range daemon {
			syscall.Kill(pid, syscall.SIGKILL)
			waitDead(t, pid)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		writes []string
		want   string
	}{
		{writes: []string{"ab", "cd"}, want: "abcd"},
		{writes: []string{"abc", "def"}, want: "[2 bytes dropped] cdef"},
		{writes: []string{"a", "bcdefgh"}, want: "[4 bytes dropped] efgh"},
		{writes: []string{"abcd", "e", "f"}, want: "[2 bytes dropped] cdef"},
	}
	for _, tc := range tests {
		tl := &tail{limit: 4}
		for _, w := range tc.writes {
			if n, err := tl.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write(%q) = %d, %v", w, n, err)
			}
		}
		if got := tl.String(); got != tc.want {
			t.Errorf("writes %q kept %q, want %q", tc.writes, got, tc.want)
		}
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("Run: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("Run error = %v, want one containing %q", err, want)
	}
}

// nulList reads a NUL-separated list (/proc/PID/cmdline, environ).
func nulList(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// waitFile waits until path exists, for within at most.
func waitFile(path string, within time.Duration) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
}

// waitDead waits until pid is gone or a zombie (dead, not yet reaped by
// whoever inherited it).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("process %d ends", pid), func() error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		// The state follows the command name's closing parenthesis.
		if s := string(stat); err == nil && strings.HasPrefix(s[strings.LastIndex(s, ")")+1:], " Z") {
			return nil
		}
		return fmt.Errorf("still runs: %s (%v)", stat, err)
	})
}

// TestRunCanceledBefore: with ctx already done no hook starts.
func TestRunCanceledBefore(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Run(ctx, Poststop, []specs.Hook{{Path: script(t, `touch "$1"`), Args: []string{"hook", marker}}}, testState, time.Minute)
	checkErr(t, err, "poststop hook 0")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v does not wrap context.Canceled", err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the hook ran with ctx done (%v)", err)
	}
}
