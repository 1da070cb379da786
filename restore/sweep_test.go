package restore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// sweepCase is one point of the full input product.
type sweepCase struct {
	pr                  profile
	mode, ann, force    string // ann "" = no annotation
	allow, strict, lazy bool
	guest               string
	huge, shared        bool
}

func (c sweepCase) inputs() Inputs {
	l := linuxLink(c.pr.name)
	l.GuestOS, l.HugePages, l.SharedMemory = c.guest, c.huge, c.shared
	in := Inputs{Hypervisor: c.pr.name, Caps: c.pr.caps(), Link: l, Config: config.Restore{
		Mode: c.mode, Strict: c.strict, AllowAnnotation: c.allow, LazyWindows: c.lazy, ForceMode: c.force}}
	if c.ann != "" {
		in.Annotations = map[string]string{AnnotationMode: c.ann}
	}
	return in
}

// effective is the mode string the policy must act on.
func (c sweepCase) effective() string {
	switch {
	case c.force != "":
		return c.force
	case c.ann != "" && c.allow:
		return c.ann
	}
	return c.mode
}

// TestDecideSweep runs every combination of hypervisor, requested mode (by
// config, annotation and force_mode), guest OS, memory flags, strict,
// allow_annotation and lazy_windows, and checks the rules that must hold.
func TestDecideSweep(t *testing.T) {
	n := 0
	for _, c := range sweepCases() {
		n++
		p, err := Decide(c.inputs())
		if msg := checkSweep(c, p, err); msg != "" {
			t.Errorf("%+v: %s", c, msg)
		}
	}
	if n != 4*5*6*2*5*2*2*2*3 {
		t.Fatalf("swept %d cases", n)
	}
}

func sweepCases() []sweepCase {
	var out []sweepCase
	bools := []bool{false, true}
	for _, pr := range profiles {
		for _, mode := range requests {
			for _, ann := range append([]string{""}, requests...) {
				for _, force := range []string{"", "mmap", "ondemand", "copy", "bogus"} {
					for _, allow := range bools {
						for _, strict := range bools {
							for _, lazy := range bools {
								for _, guest := range []string{"linux", GuestWindows} {
									for _, mem := range [][2]bool{{false, false}, {true, false}, {false, true}} {
										out = append(out, sweepCase{pr, mode, ann, force, allow, strict, lazy, guest, mem[0], mem[1]})
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}

func checkSweep(c sweepCase, p Plan, err error) string {
	eff := c.effective()
	if eff == "bogus" {
		if err == nil || !strings.Contains(err.Error(), `"bogus"`) || !strings.Contains(err.Error(), "want one of") {
			return fmt.Sprintf("unknown mode: err = %v", err)
		}
		return ""
	}
	if err != nil {
		if !c.strict || !strings.Contains(err.Error(), "restore.strict") {
			return fmt.Sprintf("unexpected error %v", err)
		}
		return ""
	}
	forcedCopy := c.huge || c.shared || (c.guest == GuestWindows && !c.lazy && c.force == "")
	switch {
	case !c.pr.caps().Supports(p.Mode):
		return fmt.Sprintf("mode %s is not supported", p.Mode)
	case p.ReleaseAfterLoad != (p.Mode == hypervisor.ModeCopy):
		return "ReleaseAfterLoad does not match copy"
	case forcedCopy && p.Mode != hypervisor.ModeCopy:
		return fmt.Sprintf("mode %s, want copy (guest %s huge %v shared %v)", p.Mode, c.guest, c.huge, c.shared)
	case !forcedCopy && eff != "auto" && c.pr.caps().Supports(hypervisor.Mode(eff)) && string(p.Mode) != eff:
		return fmt.Sprintf("mode %s, want the requested %s", p.Mode, eff)
	case c.strict && eff != "auto" && string(p.Mode) != eff && p.Mode != hypervisor.ModeCopy:
		return fmt.Sprintf("strict fell back to %s", p.Mode)
	case c.ann != "" && (!c.allow || c.force != "") && len(p.Warnings) == 0:
		return "ignored annotation without a warning"
	case len(p.Reasons) < 2:
		return fmt.Sprintf("too few reasons: %q", p.Reasons)
	}
	return ""
}
