package vm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// sweepPools removes the run dirs under parent of pooled VMs whose spare
// is gone (killed: its VM died with it), and one of this pid's, which is
// older than this spare.
func sweepPools(ctx context.Context, parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), poolPrefix))
		if !strings.HasPrefix(e.Name(), poolPrefix) || err != nil {
			continue
		}
		if pid != os.Getpid() && spareRuns(pid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
			log.G(ctx).WithError(err).Warn("remove the run dir of a dead spare's pooled VM")
		}
	}
}

// sweepPoolLeases deletes the base snapshots' leases of pooled VMs in
// namespace whose spare died before it released them (killed while it
// staged, or as the task server of a claim it had not finished); the
// garbage collector then removes the snapshots. A task's server that
// claimed a VM keeps the spare's command line, and its lease, until it
// releases it.
func sweepPoolLeases(ctx context.Context, client *containerd.Client, namespace string) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	prefix := baseimage.Key(poolPrefix)
	ls, err := client.LeasesService().List(ctx, `id~="^`+regexp.QuoteMeta(prefix)+`"`)
	if err != nil {
		log.G(ctx).WithError(err).Warn("list the leases of pooled VMs' base snapshots")
		return
	}
	for _, l := range ls {
		pid, err := strconv.Atoi(strings.TrimPrefix(l.ID, prefix))
		if err != nil || pid == os.Getpid() || spareRuns(pid) {
			continue
		}
		if err := client.LeasesService().Delete(ctx, l, leases.SynchronousDelete); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("lease", l.ID).Warn("delete the lease of a dead spare's pooled VM")
		}
	}
}

// spareRuns says whether pid is a spare task server (or one that became a
// task's), not a zombie: the owner of a pooled VM's run dir.
func spareRuns(pid int) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) == 0 || f[0] == "Z" {
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	args := strings.Split(string(cmdline), "\x00")
	return err == nil && len(args) > 1 && args[1] == spare.Flag
}
