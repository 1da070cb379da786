package restore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

const (
	mmap     = hypervisor.ModeMmap
	ondemand = hypervisor.ModeOnDemand
	cp       = hypervisor.ModeCopy
)

// profile is a hypervisor as the policy sees it: its name and static
// capabilities. Cloud Hypervisor has mmap only on a build with CopyOnWrite.
type profile struct {
	label, name string
	modes       []hypervisor.Mode
}

var profiles = []profile{
	{"qemu", "qemu", []hypervisor.Mode{mmap, cp}},
	{"ch", "cloud-hypervisor", []hypervisor.Mode{ondemand, cp}},
	{"ch-cow", "cloud-hypervisor", []hypervisor.Mode{mmap, ondemand, cp}},
	{"firecracker", "firecracker", []hypervisor.Mode{mmap, ondemand, cp}},
}

func (pr profile) caps() hypervisor.Capabilities {
	return hypervisor.Capabilities{RestoreModes: pr.modes}
}

var requests = []string{"auto", "mmap", "ondemand", "copy", "bogus"}

// matrix is the expected mode per profile and request for a linux guest
// with ordinary memory; "" means an error. The strict column differs only
// where the hypervisor lacks the mode.
var matrix = map[string]map[string][2]hypervisor.Mode{ // [lax, strict]
	"qemu": {
		"auto": {mmap, mmap}, "mmap": {mmap, mmap}, "ondemand": {cp, ""}, "copy": {cp, cp}, "bogus": {"", ""},
	},
	"ch": {
		"auto": {ondemand, ondemand}, "mmap": {ondemand, ""}, "ondemand": {ondemand, ondemand}, "copy": {cp, cp}, "bogus": {"", ""},
	},
	"ch-cow": {
		"auto": {mmap, mmap}, "mmap": {mmap, mmap}, "ondemand": {ondemand, ondemand}, "copy": {cp, cp}, "bogus": {"", ""},
	},
	"firecracker": {
		"auto": {mmap, mmap}, "mmap": {mmap, mmap}, "ondemand": {ondemand, ondemand}, "copy": {cp, cp}, "bogus": {"", ""},
	},
}

func linuxLink(hv string) *chain.Link {
	return &chain.Link{Hypervisor: hv, GuestOS: "linux", MemoryBytes: 512 << 20, PageSize: 4096}
}

// TestDecideMatrix asks for each mode through restore.mode and through an
// allowed annotation, lax and strict, on every hypervisor profile.
func TestDecideMatrix(t *testing.T) {
	for _, pr := range profiles {
		for _, req := range requests {
			for si, strict := range []bool{false, true} {
				for _, via := range []string{"config", "annotation"} {
					name := fmt.Sprintf("%s/%s/strict=%v/%s", pr.label, req, strict, via)
					t.Run(name, func(t *testing.T) {
						in := Inputs{Hypervisor: pr.name, Caps: pr.caps(), Link: linuxLink(pr.name),
							Config: config.Restore{Mode: req, Strict: strict}}
						if via == "annotation" {
							in.Config = config.Restore{Mode: "copy", Strict: strict, AllowAnnotation: true}
							in.Annotations = map[string]string{AnnotationMode: req}
						}
						want := matrix[pr.label][req][si]
						p, err := Decide(in)
						if want == "" {
							if err == nil {
								t.Fatalf("Decide = %s, want an error", p.Mode)
							}
							return
						}
						if err != nil {
							t.Fatalf("Decide: %v", err)
						}
						if p.Mode != want {
							t.Fatalf("mode = %s, want %s; reasons: %q", p.Mode, want, p.Reasons)
						}
						fellBack := req != "auto" && string(want) != req
						if fellBack != (len(p.Warnings) > 0) {
							t.Fatalf("fell back %v but warnings %q", fellBack, p.Warnings)
						}
					})
				}
			}
		}
	}
}

func TestDecideUnknownMode(t *testing.T) {
	tests := []struct {
		name string
		cfg  config.Restore
		ann  map[string]string
		want []string
	}{
		{"config mode", config.Restore{Mode: "fast"}, nil,
			[]string{`restore.mode: unknown restore mode "fast"`, "auto, mmap, ondemand, copy"}},
		{"empty config mode", config.Restore{}, nil,
			[]string{`restore.mode: unknown restore mode ""`, "auto, mmap, ondemand, copy"}},
		{"case matters", config.Restore{Mode: "MMAP"}, nil,
			[]string{`"MMAP"`, "auto, mmap, ondemand, copy"}},
		{"allowed annotation", config.Restore{Mode: "auto", AllowAnnotation: true}, map[string]string{AnnotationMode: "lazy"},
			[]string{`annotation io.cocoon.restore-mode: unknown restore mode "lazy"`, "auto, mmap, ondemand, copy"}},
		{"force mode", config.Restore{Mode: "auto", ForceMode: "uffd"}, nil,
			[]string{`restore.force_mode: unknown restore mode "uffd"`, "want one of mmap, ondemand, copy"}},
		{"force mode auto", config.Restore{Mode: "auto", ForceMode: "auto"}, nil,
			[]string{`restore.force_mode: unknown restore mode "auto"`, "want one of mmap, ondemand, copy"}},
		{"force beats a bogus annotation but not itself", config.Restore{Mode: "copy", ForceMode: "nope", AllowAnnotation: true},
			map[string]string{AnnotationMode: "mmap"}, []string{`"nope"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decide(Inputs{Hypervisor: "qemu", Caps: profiles[0].caps(), Link: linuxLink("qemu"),
				Config: tt.cfg, Annotations: tt.ann})
			if err == nil {
				t.Fatal("Decide succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestDecideRules covers the guest, memory, annotation and override rules.
func TestDecideRules(t *testing.T) {
	windows := func(hv string) *chain.Link { l := linuxLink(hv); l.GuestOS = GuestWindows; return l }
	huge := func(hv string) *chain.Link { l := linuxLink(hv); l.HugePages = true; return l }
	shared := func(hv string) *chain.Link { l := linuxLink(hv); l.SharedMemory = true; return l }
	ann := func(m string) map[string]string { return map[string]string{AnnotationMode: m} }
	fc := profiles[3]
	tests := []struct {
		name     string
		pr       profile
		link     *chain.Link
		cfg      config.Restore
		ann      map[string]string
		want     hypervisor.Mode
		warnings int
		reason   string // a reason must contain this
	}{
		{"windows auto gets copy", fc, windows("firecracker"), config.Restore{Mode: "auto"}, nil, cp, 0, "lazy_windows"},
		{"windows in any case", fc, func() *chain.Link { l := linuxLink("firecracker"); l.GuestOS = "Windows"; return l }(),
			config.Restore{Mode: "auto"}, nil, cp, 0, "windows guest gets copy"},
		{"windows asked mmap gets copy with a warning", fc, windows("firecracker"), config.Restore{Mode: "mmap"}, nil, cp, 1, "stalls"},
		{"windows lazy_windows keeps mmap", fc, windows("firecracker"), config.Restore{Mode: "auto", LazyWindows: true}, nil, mmap, 0, "lazy_windows = true"},
		{"windows forced ondemand", fc, windows("firecracker"), config.Restore{Mode: "auto", ForceMode: "ondemand"}, nil, ondemand, 0, "force_mode applies"},
		{"windows annotation mmap still copy", fc, windows("firecracker"), config.Restore{Mode: "auto", AllowAnnotation: true}, ann("mmap"), cp, 1, "stalls"},
		{"windows lazy on ch falls back to ondemand", profiles[1], windows("cloud-hypervisor"), config.Restore{Mode: "mmap", LazyWindows: true}, nil, ondemand, 1, "next best"},
		{"hugepages auto copy, with a warning that the image chose it", fc, huge("firecracker"), config.Restore{Mode: "auto"}, nil, cp, 1, "hugepage"},
		{"hugepages beat force_mode", fc, huge("firecracker"), config.Restore{Mode: "auto", ForceMode: "mmap"}, nil, cp, 1, "hugepage"},
		{"hugepages beat lazy_windows", fc, func() *chain.Link { l := huge("firecracker"); l.GuestOS = GuestWindows; return l }(),
			config.Restore{Mode: "mmap", LazyWindows: true}, nil, cp, 1, "hugepage"},
		{"hugepages under strict is copy, not an error", profiles[0], huge("qemu"), config.Restore{Mode: "mmap", Strict: true}, nil, cp, 1, "hugepage"},
		{"shared memory copy, with a warning", profiles[0], shared("qemu"), config.Restore{Mode: "auto"}, nil, cp, 1, "shared"},
		{"annotation ignored when not allowed", fc, linuxLink("firecracker"), config.Restore{Mode: "copy"}, ann("mmap"), cp, 1, `restore.mode = "copy"`},
		{"bogus annotation ignored when not allowed", fc, linuxLink("firecracker"), config.Restore{Mode: "auto"}, ann("bogus"), mmap, 1, "auto picks mmap"},
		{"annotation allowed", fc, linuxLink("firecracker"), config.Restore{Mode: "copy", AllowAnnotation: true}, ann("ondemand"), ondemand, 0, "allow_annotation = true"},
		{"annotation auto", profiles[1], linuxLink("cloud-hypervisor"), config.Restore{Mode: "copy", AllowAnnotation: true}, ann("auto"), ondemand, 0, "auto picks ondemand"},
		{"force beats annotation", fc, linuxLink("firecracker"), config.Restore{Mode: "mmap", ForceMode: "copy", AllowAnnotation: true}, ann("ondemand"), cp, 1, "overrides"},
		{"force falls back when lax", profiles[0], linuxLink("qemu"), config.Restore{Mode: "auto", ForceMode: "ondemand"}, nil, cp, 1, "next best"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Decide(Inputs{Hypervisor: tt.link.Hypervisor, Caps: tt.pr.caps(), Link: tt.link,
				Config: tt.cfg, Annotations: tt.ann})
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if p.Mode != tt.want || p.ReleaseAfterLoad != (tt.want == cp) {
				t.Fatalf("plan = %s release=%v, want %s; reasons %q", p.Mode, p.ReleaseAfterLoad, tt.want, p.Reasons)
			}
			if len(p.Warnings) != tt.warnings {
				t.Errorf("warnings = %q, want %d", p.Warnings, tt.warnings)
			}
			if !strings.Contains(strings.Join(p.Reasons, "\n"), tt.reason) {
				t.Errorf("no reason mentions %q: %q", tt.reason, p.Reasons)
			}
		})
	}
}

func TestDecideBadInputs(t *testing.T) {
	qemu := profiles[0].caps()
	tests := []struct {
		name string
		in   Inputs
		want string
	}{
		{"no link", Inputs{Hypervisor: "qemu", Caps: qemu, Config: config.Restore{Mode: "auto"}}, "no chain link"},
		{"link of another hypervisor", Inputs{Hypervisor: "qemu", Caps: qemu, Link: linuxLink("firecracker"),
			Config: config.Restore{Mode: "auto"}}, `made by "firecracker"`},
		{"no modes", Inputs{Hypervisor: "qemu", Link: linuxLink("qemu"), Config: config.Restore{Mode: "auto"}}, "no restore modes"},
		{"strict names the gap", Inputs{Hypervisor: "qemu", Caps: qemu, Link: linuxLink("qemu"),
			Config: config.Restore{Mode: "ondemand", Strict: true}}, "qemu does not support ondemand (it supports mmap, copy) and restore.strict = true"},
		{"guest memory over max_guest_memory", Inputs{Hypervisor: "qemu", Caps: qemu, Link: linuxLink("qemu"),
			Config: config.Restore{Mode: "auto", MaxGuestMemory: 256 << 20}}, "more than restore.max_guest_memory, 268435456 bytes"},
		{"guest memory over the host's", Inputs{Hypervisor: "qemu", Caps: qemu, Link: linuxLink("qemu"),
			Config: config.Restore{Mode: "auto"}, Host: Host{MemoryBytes: 64 << 20, CPUs: 2}}, "more than the host's memory"},
		{"vCPUs over max_vcpus", Inputs{Hypervisor: "qemu", Caps: qemu, Link: func() *chain.Link { l := linuxLink("qemu"); l.VCPUs = 4; return l }(),
			Config: config.Restore{Mode: "auto", MaxVCPUs: 2}}, "4 vCPUs: more than restore.max_vcpus, 2"},
		{"vCPUs over the host's", Inputs{Hypervisor: "qemu", Caps: qemu, Link: func() *chain.Link { l := linuxLink("qemu"); l.VCPUs = 64; return l }(),
			Config: config.Restore{Mode: "auto"}, Host: Host{MemoryBytes: 1 << 40, CPUs: 2}}, "more than the host's CPUs"},
		{"nothing to fall back to", Inputs{Hypervisor: "qemu", Caps: hypervisor.Capabilities{RestoreModes: []hypervisor.Mode{mmap}},
			Link: func() *chain.Link { l := linuxLink("qemu"); l.HugePages = true; return l }(), Config: config.Restore{Mode: "auto"}},
			"no slower mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decide(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Decide error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func BenchmarkDecide(b *testing.B) {
	in := Inputs{Hypervisor: "firecracker", Caps: profiles[3].caps(), Link: linuxLink("firecracker"),
		Config:      config.Restore{Mode: "mmap", AllowAnnotation: true},
		Annotations: map[string]string{AnnotationMode: "ondemand"}}
	for b.Loop() {
		if _, err := Decide(in); err != nil {
			b.Fatal(err)
		}
	}
}
