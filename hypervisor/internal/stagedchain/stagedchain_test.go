package stagedchain

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// driver is a hypervisor.Driver that only names itself and its modes.
type driver struct {
	name string
	caps hypervisor.Capabilities
}

func (d driver) Name() string { return d.name }

func (d driver) Capabilities(context.Context) (hypervisor.Capabilities, error) { return d.caps, nil }

func (d driver) Restore(context.Context, hypervisor.RestoreRequest) (hypervisor.VM, error) {
	return nil, errors.New("restore is not part of these tests")
}

// stage writes a one-link chain of hypervisor h and stages it.
func stage(t *testing.T, h string) string {
	t.Helper()
	linkDir, staged := t.TempDir(), t.TempDir()
	for _, dir := range []string{linkDir, staged} {
		if err := os.WriteFile(filepath.Join(dir, "vmstate"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	memPath := filepath.Join(staged, chain.StagedMemory)
	if err := os.WriteFile(memPath, make([]byte, 4*4096), 0o444); err != nil {
		t.Fatal(err)
	}
	meta := chain.Meta{Hypervisor: h, GuestOS: "linux", VCPUs: 2, StateFiles: []string{"vmstate"}}
	link, err := chain.WriteFull(context.Background(), memPath, meta, linkDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.WriteStaged(staged, []*chain.Link{link}); err != nil {
		t.Fatal(err)
	}
	return staged
}

func TestOpen(t *testing.T) {
	d := driver{name: "vmm", caps: hypervisor.Capabilities{RestoreModes: []hypervisor.Mode{hypervisor.ModeCopy}, Build: "vmm v1"}}
	tests := []struct {
		name, chainOf string
		mode          hypervisor.Mode
		want          string
	}{
		{"suits", "vmm", hypervisor.ModeCopy, ""},
		{"mode not offered", "vmm", hypervisor.ModeMmap, `restore mode "mmap": vmm (vmm v1) supports [copy]`},
		{"other hypervisor's chain", "qemu", hypervisor.ModeCopy, `made by "qemu" and restores only there, not on "vmm"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			staged, caps, err := Open(context.Background(), d, hypervisor.RestoreRequest{StagedDir: stage(t, tt.chainOf), Mode: tt.mode})
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want one containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if caps.Build != "vmm v1" || staged.Top().Hypervisor != "vmm" {
				t.Errorf("caps %+v, top link %+v", caps, staged.Top())
			}
		})
	}
	if _, _, err := Open(context.Background(), d, hypervisor.RestoreRequest{StagedDir: t.TempDir(), Mode: hypervisor.ModeCopy}); err == nil {
		t.Error("open an empty dir: want an error")
	}
}

func TestMeta(t *testing.T) {
	staged, err := chain.OpenStaged(stage(t, "vmm"))
	if err != nil {
		t.Fatal(err)
	}
	m := Meta(staged, "vmm", "vmm v2", []string{"a", "b"})
	if m.Hypervisor != "vmm" || m.HypervisorBuild != "vmm v2" || m.GuestOS != "linux" || m.VCPUs != 2 || len(m.StateFiles) != 2 {
		t.Errorf("meta %+v", m)
	}
}
