package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chainCommands are the chain subcommands.
var chainCommands = map[string]func(*flag.FlagSet) action{
	"link": linkFlags, "flatten": flattenFlags, "pack": packFlags, "inspect": inspectFlags,
}

// runChainCmd runs one chain subcommand and returns its output.
func runChainCmd(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	do := chainCommands[name](fs)
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	err := do(context.Background(), env{out: &out, errOut: &out}, fs.Args())
	return out.String(), err
}

// writeMemFile writes a sparse memory image of pages pages, about half of
// them non-zero, and returns it.
func writeMemFile(t *testing.T, path string, pages int, seed uint64) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	mem := make([]byte, pages*4096)
	for p := 0; p < pages; p += 1 + r.IntN(3) {
		for i := p * 4096; i < (p+1)*4096; i += 1 + r.IntN(300) {
			mem[i] = byte(r.Uint32()) | 1
		}
	}
	if err := os.WriteFile(path, mem, 0o644); err != nil {
		t.Fatal(err)
	}
	return mem
}

// makeTestChain makes a full and a diff link with cocoonctl link and returns
// their dirs and the memory the diff was made from.
func makeTestChain(t *testing.T, root string) ([]string, []byte) {
	t.Helper()
	mem0 := filepath.Join(root, "mem0")
	m := writeMemFile(t, mem0, 64, 1)
	state := filepath.Join(root, "qemu.state")
	if err := os.WriteFile(state, []byte("device state"), 0o644); err != nil {
		t.Fatal(err)
	}
	l0, l1 := filepath.Join(root, "l0"), filepath.Join(root, "l1")
	if _, err := runChainCmd(t, "link", "--memory", mem0, "--hypervisor", "qemu", "--vcpus", "2", "--state", state, "--out", l0); err != nil {
		t.Fatalf("link full: %v", err)
	}
	clear(m[4096 : 3*4096]) // pages set to zero must survive the diff
	m[20*4096+5] ^= 0xff
	mem1 := filepath.Join(root, "mem1")
	if err := os.WriteFile(mem1, m, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runChainCmd(t, "link", "--memory", mem1, "--parent", l0, "--hypervisor", "qemu", "--vcpus", "2", "--state", state, "--out", l1)
	if err != nil {
		t.Fatalf("link diff: %v", err)
	}
	if !strings.Contains(out, "diff sha256:") {
		t.Errorf("link output %q", out)
	}
	return []string{l0, l1}, m
}

func TestLinkAndFlatten(t *testing.T) {
	root := t.TempDir()
	dirs, want := makeTestChain(t, root)
	flat := filepath.Join(root, "flat")
	if _, err := runChainCmd(t, "flatten", append([]string{"--out", flat}, dirs...)...); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(flat)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("flattened chain differs from the memory of its top link")
	}
	// A diff against a given parent memory equals one against the flattened parents.
	l2 := filepath.Join(root, "l2")
	if _, err := runChainCmd(t, "link", "--memory", flat, "--parent", dirs[0], "--parent", dirs[1], "--parent-memory", flat, "--hypervisor", "qemu", "--vcpus", "2", "--out", l2); err != nil {
		t.Fatal(err)
	}
	out, err := runChainCmd(t, "inspect", l2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "diff") || !strings.Contains(out, "  0  ") {
		t.Errorf("inspect of an empty diff: %q", out)
	}
}

func TestChainCommandsRejectBadInput(t *testing.T) {
	root := t.TempDir()
	dirs, _ := makeTestChain(t, root)
	mem := filepath.Join(root, "mem0")
	corrupt := filepath.Join(root, "corrupt")
	if err := os.CopyFS(corrupt, os.DirFS(dirs[1])); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(corrupt, "memory.data"), 4096); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "out")
	tests := []struct {
		cmd  string
		args []string
		want string
	}{
		{"link", []string{"--hypervisor", "qemu", "--out", out}, "--memory is required"},
		{"link", []string{"--memory", mem, "--hypervisor", "kvmtool", "--out", out}, `--hypervisor "kvmtool"`},
		{"link", []string{"--memory", mem, "--hypervisor", "qemu", "--guest-os", "plan9", "--out", out}, `--guest-os "plan9"`},
		{"link", []string{"--memory", filepath.Join(root, "nope"), "--hypervisor", "qemu", "--out", out}, "nope"},
		{"link", []string{"--memory", mem, "--hypervisor", "qemu", "--state", filepath.Join(root, "nope.state"), "--out", out}, "nope.state"},
		{"link", []string{"--memory", mem, "--hypervisor", "qemu", "--out", dirs[0]}, "already holds a link"},
		{"link", []string{"--memory", mem, "--parent", root, "--hypervisor", "qemu", "--out", out}, "link.json"},
		{"flatten", []string{"--out", out}, "no link directories"},
		{"flatten", []string{"--out", out, dirs[0], corrupt}, "memory.data"},
		{"pack", []string{"--out", out, dirs[0]}, "--name is required"},
		{"pack", []string{"--name", "x", "--out", out, dirs[1]}, "needs its parent"},
		{"inspect", []string{filepath.Join(root, "nope")}, "nope"},
		{"inspect", []string{root}, "neither a link nor a staged dir"},
		{"inspect", []string{corrupt}, "memory.data"},
		{"inspect", []string{mem}, "not an OCI image layout"},
	}
	for _, tt := range tests {
		t.Run(tt.cmd+" "+tt.want, func(t *testing.T) {
			_, err := runChainCmd(t, tt.cmd, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("%s left %s behind", tt.cmd, out)
			}
			assertNoTemp(t, root)
		})
	}
	if code := run([]string{"flatten", "--out", out, corrupt}); code == 0 {
		t.Error("cocoonctl flatten of a corrupt chain exited 0")
	}
}

func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("temp file %s left in %s", e.Name(), dir)
		}
	}
}
