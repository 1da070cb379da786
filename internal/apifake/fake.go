package apifake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// Spec files in shared/specs.
const (
	SpecCH     = "cloud-hypervisor.yaml"
	SpecCHFork = "cloud-hypervisor.cocoonstack-dev.yaml"
	SpecFC     = "firecracker.yaml"
)

// SpecPath finds a spec file in shared/specs beside the repository, or
// stops t.
func SpecPath(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(testenv.RepoRoot(), "..", "shared", "specs", name)
	if _, err := os.Stat(p); err != nil {
		testenv.Unavailable(t, "API spec "+name+" (shared/specs beside the repository)")
	}
	return p
}

// Fake describes a fake VMM process for a driver test. The process is the
// test binary itself, re-executed; its TestMain must call RunIfFake.
type Fake struct {
	// Spec is the spec file name in shared/specs (SpecCH, ...).
	Spec string
	// Name and Version make up the --version line, e.g.
	// "cloud-hypervisor" "v53.0".
	Name, Version string
	// Fail lists operations that fail ("vm.restore", "snapshot/load").
	Fail []string
	// Hang lists operations the fake never answers.
	Hang []string
	// IgnoreCtrlAltDel makes a Firecracker guest ignore SendCtrlAltDel.
	IgnoreCtrlAltDel bool
	// GuestWrites are what the fake guest writes, a round each time the
	// restored VM starts running (CH.Guest, FC.Guest).
	GuestWrites [][]GuestWrite
}

// Script writes an executable that runs this fake with whatever arguments
// a driver passes, and returns its path and the file its requests are
// recorded in (read it with ReadRecord). When t ends, every fake process
// started through the script must have exited: a driver leaves no orphans.
func (f Fake) Script(t testing.TB) (bin, record string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("find test binary: %v", err)
	}
	dir := t.TempDir()
	record = filepath.Join(dir, "requests.jsonl")
	env := map[string]string{
		envFake: "1", envSpec: SpecPath(t, f.Spec), envRecord: record,
		envName: f.Name, envVersion: f.Version, envFail: strings.Join(f.Fail, ","), envHang: strings.Join(f.Hang, ","),
		envGuest: encodeGuestWrites(f.GuestWrites),
	}
	if f.IgnoreCtrlAltDel {
		env[envIgnoreCAD] = "1"
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for k, v := range env {
		fmt.Fprintf(&b, "export %s='%s'\n", k, v)
	}
	fmt.Fprintf(&b, "exec '%s' \"$@\"\n", self)
	bin = filepath.Join(dir, "vmm")
	if err := os.WriteFile(bin, []byte(b.String()), 0o755); err != nil {
		t.Fatalf("write fake vmm script: %v", err)
	}
	t.Cleanup(func() {
		for _, pid := range PIDs(t, record) {
			if Alive(pid) {
				t.Errorf("fake %s pid %d still running", f.Name, pid)
			}
		}
	})
	return bin, record
}

// Records reads the requests a Fake recorded, failing t on error.
func Records(t testing.TB, record string) []Request {
	t.Helper()
	reqs, err := ReadRecord(record)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return reqs
}

// Ops lists the recorded requests as "METHOD op".
func Ops(t testing.TB, record string) []string {
	t.Helper()
	var out []string
	for _, r := range Records(t, record) {
		out = append(out, r.Method+" "+r.Op)
	}
	return out
}

// Bodies returns the recorded bodies of method op, decoded; a request
// without a body gives a nil map.
func Bodies(t testing.TB, record, method, op string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range Records(t, record) {
		if r.Method != method || r.Op != op {
			continue
		}
		var m map[string]any
		if len(r.Body) > 0 {
			if err := json.Unmarshal(r.Body, &m); err != nil {
				t.Fatalf("recorded %s %s body: %v", method, op, err)
			}
		}
		out = append(out, m)
	}
	return out
}

// PIDs lists the fake processes started with a record file.
func PIDs(t testing.TB, record string) []int {
	t.Helper()
	data, err := os.ReadFile(record + pidsSuffix)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("bad pid %q in %s%s", f, record, pidsSuffix)
		}
		pids = append(pids, pid)
	}
	return pids
}

// Alive reports whether a process with pid exists (zombies included).
func Alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}
