// Package restore decides how a VM's memory comes back (the restore-mode
// policy) and runs a restore from a staged chain to a ready guest agent.
//
// The policy lives here and nowhere else: the shim, the bench and
// `cocoonctl explain` all call Decide, so what an operator is shown is what
// the runtime does.
package restore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

// AnnotationMode is the pod/container annotation that may choose the mode
// when the runtime config allows it (restore.allow_annotation).
const AnnotationMode = "io.cocoon.restore-mode"

// GuestWindows is the chain link's GuestOS for Windows guests.
const GuestWindows = "windows"

// Inputs is everything the policy looks at.
type Inputs struct {
	// Hypervisor is the driver name the VM will run on.
	Hypervisor string
	// Caps are the driver's capabilities (probed where the driver probes).
	Caps hypervisor.Capabilities
	// Link is the chain's top link: guest OS, hugepages, shared memory.
	Link *chain.Link
	// Config is the runtime class's restore section.
	Config config.Restore
	// Annotations are the OCI spec annotations (pod and container).
	Annotations map[string]string
	// Staged, if set, is the staged chain: the plan says how its memory
	// was staged (staging.Memory).
	Staged *chain.Staged
	// Host is the machine's size, the default bound on a guest's.
	Host Host
}

// Host is what a machine has for guests.
type Host struct {
	MemoryBytes int64
	CPUs        int
}

// Plan is the policy's decision.
type Plan struct {
	Mode hypervisor.Mode `json:"mode"`
	// ReleaseAfterLoad: copy restores drop the staged memory link once the
	// hypervisor has loaded it and the guest is up (Run does it), so they
	// never pin the flat cache.
	ReleaseAfterLoad bool `json:"releaseAfterLoad"`
	// Reasons explain every step of the decision, in order.
	Reasons []string `json:"reasons,omitempty"`
	// Warnings are the steps an operator should look at: fallbacks,
	// ignored annotations, overridden requests.
	Warnings []string `json:"warnings,omitempty"`
}

// request is the mode asked for and who asked for it.
type request struct {
	mode   hypervisor.Mode // empty for auto
	source string          // the config key or annotation that asked
	forced bool            // restore.force_mode: beats the guest OS rule
}

// Decide turns the inputs into a plan. Bad mode strings, a link made for
// another hypervisor and modes that cannot be honoured under strict are
// errors; everything else is a plan whose reasons say why.
func Decide(in Inputs) (Plan, error) {
	if err := checkInputs(in); err != nil {
		return Plan{}, err
	}
	var p Plan
	req, err := p.request(in)
	if err != nil {
		return Plan{}, err
	}
	mode := p.resolve(req, in)
	mode = p.memoryRule(mode, req, in.Link)
	mode = p.windowsRule(mode, req, in)
	mode, err = p.supported(mode, req, in)
	if err != nil {
		return Plan{}, err
	}
	p.Mode = mode
	p.ReleaseAfterLoad = mode == hypervisor.ModeCopy
	p.because("%s", releaseReason(mode))
	if err := p.memoryStaging(in); err != nil {
		return Plan{}, err
	}
	return p, nil
}

func checkInputs(in Inputs) error {
	if in.Link == nil {
		return errors.New("decide restore mode: no chain link: the plan depends on the guest's OS and memory flags")
	}
	if err := in.Link.RestoresOn(in.Hypervisor); err != nil {
		return fmt.Errorf("decide restore mode: %w", err)
	}
	if len(in.Caps.RestoreModes) == 0 {
		return fmt.Errorf("decide restore mode: %s reports no restore modes", in.Hypervisor)
	}
	return checkSize(in)
}

// checkSize refuses a guest larger than the config allows, or than the
// host when the config sets no bound: the image states its size.
func checkSize(in Inputs) error {
	memMax, memKey := int64(in.Config.MaxGuestMemory), "restore.max_guest_memory"
	if memMax == 0 {
		memMax, memKey = in.Host.MemoryBytes, "the host's memory (restore.max_guest_memory = 0)"
	}
	if memMax > 0 && in.Link.MemoryBytes > memMax {
		return fmt.Errorf("restore a snapshot of %d bytes of guest memory: more than %s, %d bytes", in.Link.MemoryBytes, memKey, memMax)
	}
	cpuMax, cpuKey := in.Config.MaxVCPUs, "restore.max_vcpus"
	if cpuMax == 0 {
		cpuMax, cpuKey = in.Host.CPUs, "the host's CPUs (restore.max_vcpus = 0)"
	}
	if cpuMax > 0 && in.Link.VCPUs > cpuMax {
		return fmt.Errorf("restore a snapshot of %d vCPUs: more than %s, %d", in.Link.VCPUs, cpuKey, cpuMax)
	}
	return nil
}

// request finds the mode asked for: force_mode, else the annotation if the
// config allows it, else restore.mode.
func (p *Plan) request(in Inputs) (request, error) {
	ann, hasAnn := in.Annotations[AnnotationMode]
	if in.Config.ForceMode != "" {
		m, err := parseMode("restore.force_mode", in.Config.ForceMode, false)
		if err != nil {
			return request{}, err
		}
		p.because("restore.force_mode = %q overrides restore.mode and annotations", m)
		if hasAnn {
			p.warnStep("annotation %s = %q ignored: restore.force_mode is set", AnnotationMode, ann)
		}
		return request{mode: m, source: "restore.force_mode", forced: true}, nil
	}
	if hasAnn && in.Config.AllowAnnotation {
		source := "annotation " + AnnotationMode
		m, err := parseMode(source, ann, true)
		if err != nil {
			return request{}, err
		}
		p.because("%s = %q chooses the mode (restore.allow_annotation = true)", source, ann)
		return request{mode: m, source: source}, nil
	}
	if hasAnn {
		p.warnStep("annotation %s = %q ignored: restore.allow_annotation is false", AnnotationMode, ann)
	}
	m, err := parseMode("restore.mode", in.Config.Mode, true)
	if err != nil {
		return request{}, err
	}
	if m == "" {
		p.because("restore.mode = %q asks for the best mode", in.Config.Mode)
	} else {
		p.because("restore.mode = %q asks for %s", in.Config.Mode, m)
	}
	return request{mode: m, source: "restore.mode"}, nil
}

// resolve turns auto into the hypervisor's best mode.
func (p *Plan) resolve(req request, in Inputs) hypervisor.Mode {
	if req.mode != "" {
		return req.mode
	}
	best := in.Caps.RestoreModes[0]
	p.because("auto picks %s, the best mode %s supports (%s)", best, in.Hypervisor, hypervisor.JoinModes(in.Caps.RestoreModes))
	return best
}

// memoryRule forces copy for hugepage-backed or shared guest memory: a lazy
// mode would have the VM map or fault in the staged file, which cannot back
// such memory. No setting overrides this.
func (p *Plan) memoryRule(mode hypervisor.Mode, req request, link *chain.Link) hypervisor.Mode {
	var what, why string
	switch {
	case link.HugePages:
		what, why = "hugepage-backed guest memory", "hugetlbfs memory can neither privately map the staged file nor be faulted in from it"
	case link.SharedMemory:
		what, why = "shared guest memory", "a private mapping would break the sharing and a shared one would write into the immutable staged file"
	default:
		return mode
	}
	p.because("%s needs copy: %s", what, why)
	p.overridden(req, mode, what)
	if mode != hypervisor.ModeCopy && req.mode == "" {
		// The image's flags chose the costliest mode, holding all of its
		// guest memory privately: the operator should see it.
		p.warn("the snapshot's %s forces copy: the VM holds all %d bytes of its guest memory privately", what, link.MemoryBytes)
	}
	return hypervisor.ModeCopy
}

// windowsRule gives Windows guests copy: faulting memory in lazily stalls
// their boot and DHCP. lazy_windows or force_mode lift it.
func (p *Plan) windowsRule(mode hypervisor.Mode, req request, in Inputs) hypervisor.Mode {
	if !strings.EqualFold(in.Link.GuestOS, GuestWindows) || mode == hypervisor.ModeCopy {
		return mode
	}
	switch {
	case req.forced:
		p.because("windows guest: restore.force_mode applies, so %s is kept", mode)
		return mode
	case in.Config.LazyWindows:
		p.because("windows guest: restore.lazy_windows = true allows %s", mode)
		return mode
	}
	p.because("windows guest gets copy: a lazy restore stalls its boot and DHCP while memory faults in (restore.lazy_windows = true allows lazy modes)")
	p.overridden(req, mode, "the windows guest")
	return hypervisor.ModeCopy
}

// supported checks mode against the capabilities and falls back to the
// next best mode the hypervisor has, unless strict.
func (p *Plan) supported(mode hypervisor.Mode, req request, in Inputs) (hypervisor.Mode, error) {
	caps := in.Caps
	if caps.Supports(mode) {
		return mode, nil
	}
	have := hypervisor.JoinModes(caps.RestoreModes)
	if in.Config.Strict {
		return "", fmt.Errorf("decide restore mode: %s does not support %s (it supports %s) and restore.strict = true",
			in.Hypervisor, mode, have)
	}
	next, ok := nextBest(mode, caps)
	if !ok {
		return "", fmt.Errorf("decide restore mode: %s does not support %s (it supports %s) and has no slower mode to fall back to",
			in.Hypervisor, mode, have)
	}
	msg := fmt.Sprintf("%s does not support %s (it supports %s): falling back to %s, the next best", in.Hypervisor, mode, have, next)
	if req.mode == mode {
		msg = fmt.Sprintf("%s asked for %s, but %s", req.source, mode, msg)
	}
	p.warnStep("%s", msg)
	return next, nil
}

// nextBest is the first mode after m, in hypervisor.Modes order (best
// first), that caps supports.
func nextBest(m hypervisor.Mode, caps hypervisor.Capabilities) (hypervisor.Mode, bool) {
	after := false
	for _, x := range hypervisor.Modes {
		if after && caps.Supports(x) {
			return x, true
		}
		if x == m {
			after = true
		}
	}
	return "", false
}

// overridden warns when a rule replaced a mode someone explicitly asked for.
func (p *Plan) overridden(req request, mode hypervisor.Mode, what string) {
	if req.mode != "" && mode != hypervisor.ModeCopy {
		p.warn("%s asked for %s, but %s gets copy", req.source, mode, what)
	}
}

func releaseReason(m hypervisor.Mode) string {
	switch m {
	case hypervisor.ModeCopy:
		return "copy loads all memory before resume, so the staged memory link is released once the restored guest is up and does not pin the flat cache"
	case hypervisor.ModeMmap:
		return "mmap maps the staged memory file privately (copy-on-write) for the VM's life, so the staged link is kept"
	default:
		return "ondemand faults memory in from the staged file for the VM's life, so the staged link is kept"
	}
}

// parseMode parses a mode request, naming where it came from; auto reads
// as "" (no particular mode).
func parseMode(source, s string, allowAuto bool) (hypervisor.Mode, error) {
	m, err := hypervisor.ParseMode(s, allowAuto)
	if err != nil {
		return "", fmt.Errorf("%s: %w", source, err)
	}
	if m == hypervisor.ModeAuto {
		return "", nil
	}
	return m, nil
}

func (p *Plan) because(format string, args ...any) {
	p.Reasons = append(p.Reasons, fmt.Sprintf(format, args...))
}

func (p *Plan) warn(format string, args ...any) {
	p.Warnings = append(p.Warnings, fmt.Sprintf(format, args...))
}

// warnStep records a step that sets aside what was asked: it is both part of
// the decision and something an operator should see.
func (p *Plan) warnStep(format string, args ...any) {
	p.because(format, args...)
	p.warn(format, args...)
}
