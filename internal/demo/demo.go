// Package demo shows cocoon end to end: a cached snapshot image imported
// into a private containerd on the cocoon snapshotter, and one container
// run from it through the cocoon shim per restore mode, with its output and
// the shim's restore report.
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/state"
)

// Options are the demo's flags.
type Options struct {
	Guest, Cache, Memory string
	// BinDir holds containerd, ctr, cocoon-snapshotter, the shim and
	// cocoonctl (make build).
	BinDir string
	// Keep leaves containerd and the snapshotter running and prints ctr
	// commands to try.
	Keep bool
}

// script is what the demo container runs in its restored guest.
const script = `echo "hello from $(hostname), a microVM restored from a snapshot"; uname -sr; echo "guest uptime $(cut -d' ' -f1 /proc/uptime)s: it booted once, at bake time"`

// Run runs the demo, printing each step to out.
func Run(ctx context.Context, out io.Writer, o Options) (err error) {
	step(out, "snapshot image")
	img, err := stackrun.EnsureImage(ctx, out, stackrun.ImageSpec{Guest: o.Guest, Cache: o.Cache, Memory: o.Memory, BinDir: o.BinDir})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s (cached: %v)\n  link    %s\n  archive %s\n", img.Ref, img.Cached, img.LinkDir, img.Archive)

	step(out, "private containerd v2.4.2 + cocoon-snapshotter, ctr images import --snapshotter cocoon "+img.Archive)
	cfg, err := stackrun.AnnotatedConfig()
	if err != nil {
		return err
	}
	stack, image, err := stackrun.StartStack(ctx, o.BinDir, cfg, img)
	if err != nil {
		return err
	}
	defer func() {
		if o.Keep && err == nil {
			printKeep(out, stack, img)
			return
		}
		step(out, "tear down")
		err = errors.Join(err, stack.Close())
	}()
	fmt.Fprintf(out, "containerd %s\nsnapshotter %s\ncocoon config %s ([restore] allow_annotation = true)\n", stack.Address, stack.SnapshotterAddress, stack.ConfigPath)
	for _, mode := range []hypervisor.Mode{hypervisor.ModeMmap, hypervisor.ModeCopy} {
		if err := runMode(ctx, out, stack, image, mode); err != nil {
			return err
		}
	}
	return nil
}

// Down tears down a stack a Keep demo left in dir.
func Down(dir string) error {
	return devstack.Destroy(dir)
}

// runMode runs script in a container restored in mode and prints its
// output and the shim's restore report.
func runMode(ctx context.Context, out io.Writer, stack *devstack.Stack, image client.Image, mode hypervisor.Mode) error {
	id := "demo-" + string(mode)
	step(out, fmt.Sprintf("run %s with %s=%s", id, restore.AnnotationMode, mode))
	fmt.Fprintf(out, "same as: ctr run --rm --snapshotter %s --runtime %s --annotation %s=%s %s %s /bin/sh -c '...'\n",
		devstack.Snapshotter, devstack.Runtime, restore.AnnotationMode, mode, image.Name(), id)
	cl, err := stack.Client()
	if err != nil {
		return err
	}
	var stdout, stderr bytes.Buffer
	c := stackrun.Cocoon(id, image, mode, []string{"/bin/sh", "-c", script})
	c.IO = cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr))
	start := time.Now()
	rc, err := stackrun.Run(ctx, cl, c)
	if err != nil {
		return err
	}
	running := time.Since(start)
	exit, rep, err := finish(ctx, stack, rc.Task, id)
	// Deleting the task also waits for its output to be copied.
	if err := errors.Join(err, rc.Stop(context.WithoutCancel(ctx))); err != nil {
		return err
	}
	fmt.Fprintf(out, "container output (exit status %d, running %s after create):\n%s%s",
		exit, running.Round(time.Millisecond), indent(stdout.String()), indent(stderr.String()))
	printReport(out, rep)
	if exit != 0 {
		return fmt.Errorf("%s exited with status %d", id, exit)
	}
	return nil
}

// finish waits for the task's exit and reads the shim's restore report
// from its bundle, which goes with the task.
func finish(ctx context.Context, stack *devstack.Stack, task client.Task, id string) (uint32, *state.Report, error) {
	exit, err := waitExit(ctx, task)
	if err != nil {
		return 0, nil, err
	}
	rep, err := stackrun.ReadReport(stack, id)
	if err != nil {
		return 0, nil, err
	}
	return exit, rep, nil
}

func waitExit(ctx context.Context, task client.Task) (uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ch, err := task.Wait(ctx)
	if err != nil {
		return 0, fmt.Errorf("wait for task: %w", err)
	}
	select {
	case st := <-ch:
		code, _, err := st.Result()
		return code, err
	case <-ctx.Done():
		return 0, fmt.Errorf("wait for task: %w", ctx.Err())
	}
}

func printReport(out io.Writer, r *state.Report) {
	fmt.Fprintf(out, "restore report (%s in the bundle):\n  hypervisor %s, mode %s, staged memory released once the guest is up: %v\n",
		state.ReportFile, r.Hypervisor, r.Plan.Mode, r.Plan.ReleaseAfterLoad)
	for _, reason := range r.Plan.Reasons {
		fmt.Fprintf(out, "  reason:  %s\n", reason)
	}
	for _, w := range r.Plan.Warnings {
		fmt.Fprintf(out, "  warning: %s\n", w)
	}
	for _, p := range r.Phases {
		fmt.Fprintf(out, "  %-16s %10s\n", p.Name, time.Duration(p.Duration).Round(10*time.Microsecond))
	}
	fmt.Fprintf(out, "  %-16s %10s\n", "total", time.Duration(r.Total).Round(10*time.Microsecond))
}

func printKeep(out io.Writer, s *devstack.Stack, img stackrun.SnapshotImage) {
	step(out, "left running in "+s.Dir)
	run := fmt.Sprintf("--fifo-dir %s --snapshotter %s --runtime %s", s.FifoDir, devstack.Snapshotter, devstack.Runtime)
	fmt.Fprintf(out, `Try:
  ctr="%s"
  $ctr images ls
  $ctr run --rm %s --annotation %s=mmap %s try1 /bin/sh -c 'uname -a; free -m'
  $ctr run -d %s %s try2 /bin/sleep 600
  $ctr tasks ls
  $ctr tasks exec -t --fifo-dir %s --exec-id sh1 try2 /bin/sh
  $ctr tasks kill -s KILL try2; $ctr tasks rm try2; $ctr containers rm try2
Logs: %s/containerd.log (the shims log there too), %s/cocoon-snapshotter.log
Tear down: %s/cocoon-bench demo --down %s
`, strings.Join(s.CtrArgs(), " "), run, restore.AnnotationMode, img.Ref, run, img.Ref, s.FifoDir,
		s.Dir, s.Dir, s.BinDir, s.Dir)
}

func step(out io.Writer, what string) {
	fmt.Fprintf(out, "\n==> %s\n", what)
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "  | " + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n  | ") + "\n"
}
