package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
)

// explain prints the restore plan the shim would make for a chain link,
// with the policy's reasons and warnings.
//
// The hypervisor's capabilities come from its driver, as in the shim, so
// the configured binary must be installed (drivers read its version). For
// cloud-hypervisor they depend on cloud_hypervisor.copy_on_write: "probe"
// asks the binary whether it accepts CopyOnWrite, so mmap is offered only on
// a build that has it (the cocoonstack fork) and an upstream build plans
// ondemand instead; "yes" or "no" pin the answer without the probe.
func init() {
	register(command{
		name:    "explain",
		summary: "show the restore plan for a chain link and why",
		flags:   explainFlags,
	})
}

// buildOf names the hypervisor build where the driver leaves that to an
// explicit probe (QEMU keeps it off the restore path).
func buildOf(ctx context.Context, d hypervisor.Driver, caps hypervisor.Capabilities) (string, error) {
	if b, ok := d.(hypervisor.BuildReporter); ok && caps.Build == "" {
		return b.Build(ctx)
	}
	return caps.Build, nil
}

type explainOptions struct {
	link, staged, config, hypervisor string
	annotations                      annotations
	base                             baseOptions
	// newDriver builds the configured driver, as the shim does.
	newDriver func(config.Config) (hypervisor.Driver, error)
}

func explainFlags(fs *flag.FlagSet) action {
	o := explainOptions{annotations: annotations{}}
	fs.StringVar(&o.link, "link", "", "the chain's top link `dir`ectory (this or --staged)")
	fs.StringVar(&o.staged, "staged", "", "a container snapshot's staged `dir`ectory (chain.json): also says how its memory was staged and why")
	fs.StringVar(&o.config, "config", "", "config.toml `file` (default $"+config.EnvPath+", else "+config.DefaultPath+", else built-in defaults)")
	fs.StringVar(&o.hypervisor, "hypervisor", "", "plan for this hypervisor `name` instead of the config's")
	fs.Var(o.annotations, "annotation", "an OCI annotation `k=v` of the container, e.g. "+restore.AnnotationMode+"=mmap (repeatable)")
	o.base.flags(fs)
	return func(ctx context.Context, e env, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unexpected arguments %q: explain takes only flags", args)
		}
		o.newDriver = e.newDriver
		return explain(ctx, e.out, o)
	}
}

func explain(ctx context.Context, out io.Writer, o explainOptions) (retErr error) {
	cfg, source, err := loadExplainConfig(o.config, o.hypervisor)
	if err != nil {
		return err
	}
	t, err := explainTarget(ctx, o, cfg)
	if err != nil {
		return err
	}
	if t.base != nil {
		defer func() { retErr = errors.Join(retErr, t.base.Release()) }()
	}
	d, err := o.newDriver(cfg)
	if err != nil {
		return err
	}
	plan, caps, err := restore.PlanFor(ctx, d, cfg.Restore, t.link, t.staged, o.annotations)
	if err != nil {
		return err
	}
	if t.why != "" {
		plan.Reasons = append([]string{t.why}, plan.Reasons...)
	}
	if caps.Build, err = buildOf(ctx, d, caps); err != nil {
		return fmt.Errorf("%s build: %w", d.Name(), err)
	}
	printPlan(out, o, t, cfg.Hypervisor, caps, source, plan)
	return nil
}

// target is what explain plans for: a top link, its staged chain when
// there is one, and a base snapshot picked for --base, with why.
type target struct {
	where  string
	link   *chain.Link
	staged *chain.Staged
	base   *explainBase
	why    string
}

// explainTarget reads the top link from --link, the staged chain and its
// top link from --staged, or stages the base --base asks for.
func explainTarget(ctx context.Context, o explainOptions, cfg config.Config) (target, error) {
	given := 0
	for _, set := range []bool{o.link != "", o.staged != "", o.base.base} {
		if set {
			given++
		}
	}
	switch {
	case given != 1:
		return target{}, errors.New("give one of --link (the chain's top link directory), --staged (a staged directory) and --base (the runtime class's base snapshot)")
	case o.link != "":
		l, err := chain.ReadLink(o.link)
		return target{where: o.link, link: l}, err
	case o.staged != "":
		st, err := chain.OpenStaged(o.staged)
		if err != nil {
			return target{}, err
		}
		return target{where: "top of the chain staged in " + o.staged, link: st.Top(), staged: st}, nil
	}
	b, why, err := o.base.pick(ctx, cfg)
	if err != nil {
		return target{}, err
	}
	return target{where: "top of base snapshot " + b.image + " staged in " + b.dir, link: b.link, staged: b.staged, base: b, why: why}, nil
}

// loadExplainConfig finds the config as the shim does and applies the
// --hypervisor override.
func loadExplainConfig(path, hv string) (config.Config, string, error) {
	cfg, source := config.Default(), "built-in defaults"
	if p, ok := config.Resolve(path); ok {
		var err error
		if cfg, err = config.Load(p); err != nil {
			return config.Config{}, "", err
		}
		source = p
	}
	if hv != "" {
		cfg.Hypervisor = hv
		if err := cfg.Validate(); err != nil {
			return config.Config{}, "", fmt.Errorf("--hypervisor: %w", err)
		}
	}
	return cfg, source, nil
}

func printPlan(w io.Writer, o explainOptions, t target, hv string, caps hypervisor.Capabilities, source string, p restore.Plan) {
	l := t.link
	made := l.Hypervisor
	if l.HypervisorBuild != "" {
		made += ": " + l.HypervisorBuild
	}
	fmt.Fprintf(w, "link         %s (%s, made by %s)\n", t.where, l.Kind, made)
	fmt.Fprintf(w, "guest        %s, %d vCPUs, %s memory, %s pages, hugepages %s, shared memory %s\n",
		l.GuestOS, l.VCPUs, units.BytesSize(float64(l.MemoryBytes)), units.BytesSize(float64(l.PageSize)),
		yesNo(l.HugePages), yesNo(l.SharedMemory))
	build := ""
	if caps.Build != "" {
		build = " (" + caps.Build + ")"
	}
	fmt.Fprintf(w, "hypervisor   %s%s, restore modes %s\n", hv, build, hypervisor.JoinModes(caps.RestoreModes))
	fmt.Fprintf(w, "config       %s\n", source)
	if len(o.annotations) > 0 {
		fmt.Fprintf(w, "annotations  %s\n", o.annotations)
	}
	release := "kept for the VM's life"
	if p.ReleaseAfterLoad {
		release = "released once the guest is up"
	}
	fmt.Fprintf(w, "\nplan         %s (staged memory %s)\n\nreasons\n", p.Mode, release)
	for i, r := range p.Reasons {
		fmt.Fprintf(w, "  %d. %s\n", i+1, r)
	}
	if len(p.Warnings) > 0 {
		fmt.Fprintln(w, "\nwarnings")
		for _, r := range p.Warnings {
			fmt.Fprintf(w, "  - %s\n", r)
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// annotations collects repeated --annotation k=v flags.
type annotations map[string]string

func (a annotations) String() string {
	kv := make([]string, 0, len(a))
	for k, v := range a {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, " ")
}

func (a annotations) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("annotation %q: want key=value", s)
	}
	a[k] = v
	return nil
}
