package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/drivers"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// staticDriver stands in for the drivers: Cloud Hypervisor without
// CopyOnWrite, as copy_on_write = "no" (or a probe of an upstream build)
// reports it.
type staticDriver struct{ name string }

var staticModes = map[string][]hypervisor.Mode{
	"qemu":             {hypervisor.ModeMmap, hypervisor.ModeCopy},
	"cloud-hypervisor": {hypervisor.ModeOnDemand, hypervisor.ModeCopy},
	"firecracker":      {hypervisor.ModeMmap, hypervisor.ModeOnDemand, hypervisor.ModeCopy},
}

func newStaticDriver(cfg config.Config) (hypervisor.Driver, error) {
	if _, ok := staticModes[cfg.Hypervisor]; !ok {
		return nil, fmt.Errorf("hypervisor %q: not a test driver", cfg.Hypervisor)
	}
	return staticDriver{cfg.Hypervisor}, nil
}

func (d staticDriver) Name() string { return d.name }

func (d staticDriver) Capabilities(context.Context) (hypervisor.Capabilities, error) {
	return hypervisor.Capabilities{RestoreModes: staticModes[d.name], Build: d.name + " test build"}, nil
}

func (d staticDriver) Restore(context.Context, hypervisor.RestoreRequest) (hypervisor.VM, error) {
	return nil, errors.New("a static test driver restores nothing")
}

// explainLink writes a full link of an empty (sparse) 512 MiB guest made by hv.
func explainLink(t *testing.T, hv, guestOS string, huge bool) string {
	t.Helper()
	return explainLinkOf(t, hv, guestOS, huge, 512<<20)
}

// explainLinkOf writes a full link of an empty (sparse) guest of size
// bytes made by hv.
func explainLinkOf(t *testing.T, hv, guestOS string, huge bool, size int64) string {
	t.Helper()
	mem := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(mem, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(mem, size); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	meta := chain.Meta{Hypervisor: hv, HypervisorBuild: hv + " 1.0", GuestOS: guestOS, VCPUs: 2, HugePages: huge}
	if _, err := chain.WriteFull(context.Background(), mem, meta, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// explainStagedFork stages a fork of the link in base as a node with base
// flattened does: base's memory plus the fork's as a delta.
func explainStagedFork(t *testing.T, base string) string {
	t.Helper()
	mem := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(mem, []byte("forked"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(mem, 512<<20); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	meta := chain.Meta{Hypervisor: "qemu", HypervisorBuild: "qemu 1.0", GuestOS: "linux", VCPUs: 2}
	fork, err := chain.WriteDiffPages(context.Background(), mem, []chain.Extent{{Offset: 0, Length: 4096}}, base, meta, dir)
	if err != nil {
		t.Fatal(err)
	}
	parent, err := chain.ReadLink(base)
	if err != nil {
		t.Fatal(err)
	}
	staged := t.TempDir()
	if err := chain.WriteStagedMemory(staged, []*chain.Link{parent, fork}, chain.StagedMemoryInfo{Covers: 1, Reason: "the base is flattened here"}); err != nil {
		t.Fatal(err)
	}
	return staged
}

func explainConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runExplainCmd(t *testing.T, newDriver func(config.Config) (hypervisor.Driver, error), args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	do := explainFlags(fs)
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	err := do(context.Background(), env{out: &out, errOut: &out, newDriver: newDriver}, fs.Args())
	return out.String(), err
}

func TestExplain(t *testing.T) {
	t.Setenv(config.EnvPath, "")
	qemuLink := explainLink(t, "qemu", "linux", false)
	chLink := explainLink(t, "cloud-hypervisor", "linux", false)
	winLink := explainLink(t, "firecracker", "windows", false)
	hugeLink := explainLink(t, "qemu", "linux", true)
	allow := explainConfig(t, "hypervisor = \"firecracker\"\n[restore]\nallow_annotation = true\n")
	strictCH := explainConfig(t, "hypervisor = \"cloud-hypervisor\"\n[restore]\nmode = \"mmap\"\nstrict = true\n")
	tests := []struct {
		name string
		args []string
		want []string // substrings of the output, or of the error if err
		err  bool
	}{
		{"qemu auto", []string{"--link", qemuLink, "--config", explainConfig(t, "")},
			[]string{"plan         mmap (staged memory kept for the VM's life)", "1. restore.mode = \"auto\"",
				"auto picks mmap, the best mode qemu supports (mmap, copy)", "(full, made by qemu: qemu 1.0)", "qemu (qemu test build), restore modes mmap, copy",
				"linux, 2 vCPUs, 512MiB memory, 4KiB pages, hugepages no"}, false},
		{"annotation ignored by default", []string{"--link", qemuLink, "--config", explainConfig(t, ""), "--annotation", "io.cocoon.restore-mode=copy"},
			[]string{"plan         mmap", "warnings", "ignored: restore.allow_annotation is false", "annotations  io.cocoon.restore-mode=copy"}, false},
		{"annotation allowed", []string{"--link", winLink, "--config", allow, "--annotation", "io.cocoon.restore-mode=ondemand"},
			[]string{"plan         copy (staged memory released once the guest is up)", "windows guest", "asked for ondemand"}, false},
		{"hypervisor flag picks ch", []string{"--link", chLink, "--config", explainConfig(t, ""), "--hypervisor", "cloud-hypervisor", "--annotation", "a=b"},
			[]string{"plan         ondemand", "auto picks ondemand", "annotations  a=b"}, false},
		{"hugepages", []string{"--link", hugeLink, "--config", explainConfig(t, "[restore]\nforce_mode = \"mmap\"\n")},
			[]string{"plan         copy", "hugepage-backed"}, false},
		{"strict fails", []string{"--link", chLink, "--config", strictCH},
			[]string{"cloud-hypervisor does not support mmap", "restore.strict = true"}, true},
		{"unknown annotation mode", []string{"--link", winLink, "--config", allow, "--annotation", "io.cocoon.restore-mode=fast"},
			[]string{`"fast"`, "want one of auto, mmap, ondemand, copy"}, true},
		{"link for another hypervisor", []string{"--link", qemuLink, "--hypervisor", "firecracker"}, []string{`made by "qemu"`}, true},
		{"unknown hypervisor", []string{"--link", qemuLink, "--hypervisor", "xen"}, []string{`"xen"`}, true},
		{"no link", []string{}, []string{"give one of --link"}, true},
		{"link and staged", []string{"--link", qemuLink, "--staged", qemuLink}, []string{"give one of --link"}, true},
		{"staged with a delta", []string{"--staged", explainStagedFork(t, qemuLink), "--config", explainConfig(t, "")},
			[]string{"top of the chain staged in", "(diff, made by qemu", "memory: the staged file holds links 1-1 and the restore writes the top 1 into the guest before it runs (the base is flattened here)"}, false},
		{"bad annotation", []string{"--link", qemuLink, "--annotation", "novalue"}, []string{"want key=value"}, true},
		{"stray argument", []string{"--link", qemuLink, "extra"}, []string{"unexpected arguments"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runExplainCmd(t, newStaticDriver, tt.args...)
			got := out
			if tt.err {
				if err == nil {
					t.Fatalf("explain succeeded, want an error; output:\n%s", out)
				}
				got = err.Error()
			} else if err != nil {
				t.Fatalf("explain: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in:\n%s", w, got)
				}
			}
		})
	}
}

// TestExplainRegistered runs explain through the CLI entry point.
func TestExplainRegistered(t *testing.T) {
	t.Setenv(config.EnvPath, explainConfig(t, "[restore]\nmode = \"bogus\"\n"))
	if code := run([]string{"explain", "--link", explainLink(t, "qemu", "linux", false)}); code != 1 {
		t.Fatalf("explain with a bad config mode exited %d, want 1", code)
	}
}

// TestExplainQEMU asks the real QEMU driver for its capabilities: the
// binary's version is the build shown.
func TestExplainQEMU(t *testing.T) {
	bin := testenv.QEMU(t)
	cfg := explainConfig(t, "[qemu]\nbinary = \""+bin+"\"\n")
	out, err := runExplainCmd(t, drivers.New, "--link", explainLink(t, "qemu", "linux", false), "--config", cfg)
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	for _, w := range []string{"restore modes mmap, copy", "QEMU emulator version", "plan         mmap"} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in:\n%s", w, out)
		}
	}
}

// TestExplainBase: --base plans for the base the shim would pick of the
// config's restore.base_images (smallest first) for a pod's memory or a
// container's limit, says why first among the reasons, and lets go of
// every base it staged.
func TestExplainBase(t *testing.T) {
	t.Setenv(config.EnvPath, "")
	links := map[string]string{"small": explainLinkOf(t, "qemu", "linux", false, 256<<20), "large": explainLinkOf(t, "qemu", "linux", false, 1<<30)}
	two := explainConfig(t, "[restore]\nbase_images = [\"small\", \"large\"]\n")
	one := explainConfig(t, "[restore]\nbase_image = \"large\"\n")
	for _, tc := range []struct {
		name   string
		config string
		pod    string
		limit  string
		want   string // in the output, or the error
		staged []string
	}{
		{"pod", two, "300M", "", "1. base snapshot large (1GiB of guest memory): the smallest that holds the pod's 300MiB of restore.base_images", []string{"small", "large"}},
		{"container", two, "", "512M", "1. base snapshot small (256MiB of guest memory): the largest whose guest memory the container's limit 512MiB holds", []string{"large", "small"}},
		{"no memory", two, "", "", "1. base snapshot small (256MiB of guest memory): the container has no memory limit: the smallest", []string{"small"}},
		{"one base", one, "4G", "", "1. base snapshot large: the runtime class's only one (restore.base_image)", []string{"large"}},
		{"too large a pod", two, "4G", "", "none of restore.base_images has at least the pod's 4GiB of guest memory", []string{"small", "large"}},
		{"both", two, "1G", "1G", "give one of --pod-memory and --memory-limit", nil},
		{"no base", explainConfig(t, ""), "", "", "the config sets neither restore.base_image nor restore.base_images", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var staged, released []string
			o := explainOptions{config: tc.config, newDriver: newStaticDriver, annotations: annotations{}}
			o.base.base = true
			for flagv, v := range map[*sizeFlag]string{&o.base.podMemory: tc.pod, &o.base.memoryLimit: tc.limit} {
				if v != "" {
					if err := flagv.Set(v); err != nil {
						t.Fatal(err)
					}
				}
			}
			o.base.stage = func(_ context.Context, _ config.Config, image string) (*explainBase, int64, error) {
				staged = append(staged, image)
				l, err := chain.ReadLink(links[image])
				if err != nil {
					return nil, 0, err
				}
				release := func() error { released = append(released, image); return nil }
				return &explainBase{image: image, dir: links[image], link: l, release: release}, l.MemoryBytes, nil
			}
			var out bytes.Buffer
			err := explain(context.Background(), &out, o)
			got := out.String()
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("missing %q in:\n%s", tc.want, got)
			}
			if !slices.Equal(staged, tc.staged) || len(released) != len(staged) {
				t.Errorf("staged %v and released %v, want %v staged and all released", staged, released, tc.staged)
			}
		})
	}
}
