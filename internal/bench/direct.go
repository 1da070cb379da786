package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/continuity/fs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/config"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/drivers"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/stackrun"
	"github.com/cocoonstack/containerd-shim-cocoon/restore"
	"github.com/cocoonstack/containerd-shim-cocoon/snapshotter"
)

// agentTimeout bounds waiting for a guest's agent; 16 TCG guests on 2
// cores are slow to answer.
const agentTimeout = 2 * time.Minute

// directPath restores with restore.Run and the QEMU driver on dirs staged
// by an in-process snapshotter: no containerd, no shim.
type directPath struct {
	dir    string
	sn     *snapshotter.Snapshotter
	driver hypervisor.Driver
	caps   hypervisor.Capabilities
	link   *chain.Link
	top    string
}

const directTop = "link"

// newDirectPath imports img's link into a fresh snapshotter under dir, as
// containerd's unpacker would: Prepare with the ref label, write, Commit.
func newDirectPath(ctx context.Context, img stackrun.SnapshotImage, dir string) (p *directPath, err error) {
	cfg, err := config.Load("")
	if err != nil {
		return nil, err
	}
	driver, err := drivers.New(cfg)
	if err != nil {
		return nil, err
	}
	caps, err := driver.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	sn, err := snapshotter.New(ctx, filepath.Join(dir, "sn"))
	if err != nil {
		return nil, err
	}
	p = &directPath{dir: dir, sn: sn, driver: driver, caps: caps, top: directTop}
	defer func() {
		if err != nil {
			sn.Close()
		}
	}()
	if p.link, err = importLink(ctx, sn, img.LinkDir, directTop); err != nil {
		return nil, err
	}
	return p, nil
}

func importLink(ctx context.Context, sn snapshots.Snapshotter, linkDir, name string) (*chain.Link, error) {
	const key = "extract-" + directTop
	ms, err := sn.Prepare(ctx, key, "", snapshots.WithLabels(map[string]string{snapshots.LabelSnapshotRef: name}))
	if err != nil {
		return nil, fmt.Errorf("prepare link import: %w", err)
	}
	dst, err := stagedDir(ms)
	if err != nil {
		return nil, err
	}
	if err := fs.CopyDir(dst, linkDir); err != nil {
		return nil, fmt.Errorf("copy link into the import: %w", err)
	}
	if err := sn.Commit(ctx, name, key); err != nil {
		return nil, fmt.Errorf("commit link: %w", err)
	}
	return chain.ReadLink(linkDir)
}

// stagedDir is the directory the snapshotter's one bind mount exposes.
func stagedDir(ms []mount.Mount) (string, error) {
	if len(ms) != 1 || ms[0].Type != "bind" {
		return "", fmt.Errorf("snapshot mounts %+v: want one bind mount of a directory", ms)
	}
	return ms[0].Source, nil
}

// stage stages the chain for one clone, removes it again and returns how
// long staging took.
func (p *directPath) stage(ctx context.Context) (time.Duration, error) {
	return prepareOnce(ctx, p.sn, "first", p.top)
}

// directArm restores on the direct path in one mode.
type directArm struct {
	p    *directPath
	mode hypervisor.Mode
}

func (a directArm) start(ctx context.Context, id string) (*clone, error) {
	p, mode := a.p, a.mode
	start := time.Now()
	ms, err := p.sn.Prepare(ctx, id, p.top)
	if err != nil {
		return nil, fmt.Errorf("stage %s: %w", id, err)
	}
	staged := time.Since(start)
	unstage := func(err error) error { return errors.Join(err, p.sn.Remove(context.Background(), id)) }
	dir, err := stagedDir(ms)
	if err != nil {
		return nil, unstage(err)
	}
	plan, err := restore.Decide(restore.Inputs{
		Hypervisor: p.driver.Name(), Caps: p.caps, Link: p.link,
		Config: config.Restore{Mode: string(mode), Strict: true},
	})
	if err != nil {
		return nil, unstage(err)
	}
	res, err := restore.Run(ctx, p.driver, restore.Request{
		StagedDir: dir, RunDir: filepath.Join(p.dir, "run", id), Plan: plan,
		Hostname: id, AgentTimeout: agentTimeout,
	})
	if err != nil {
		return nil, unstage(err)
	}
	stop := func(context.Context) error {
		res.Agent.Close()
		return unstage(res.VM.Close())
	}
	execStart := time.Now()
	if err := startProcess(ctx, res.Agent); err != nil {
		return nil, errors.Join(err, stop(ctx))
	}
	c := &clone{pid: res.VM.PID(), guestKiB: p.link.MemoryBytes >> 10, ready: time.Since(start), stop: stop}
	c.phases = append(c.phases, phase{Name: phaseStage, Duration: staged})
	for _, ph := range res.Report.Phases {
		c.phases = append(c.phases, phase{Name: ph.Name, Duration: ph.Duration.D()})
	}
	c.phases = append(c.phases, phase{Name: phaseStarted, Duration: time.Since(execStart)})
	return c, nil
}

func (p *directPath) close() error {
	return p.sn.Close()
}

// startProcess starts benchArgs in the guest and opens its stdio, as the
// shim does for a container's init, so both paths do the same guest work.
func startProcess(ctx context.Context, c *agent.Client) error {
	const id = "bench"
	proc, err := c.Exec(ctx, agent.ExecRequest{ID: id, Args: benchArgs, Cwd: "/"})
	if err != nil {
		return err
	}
	_, stdout, stderr := proc.Stdio()
	go io.Copy(io.Discard, stdout)
	go io.Copy(io.Discard, stderr)
	return nil
}
