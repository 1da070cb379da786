package vm

import (
	"context"
	"os"
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
// is gone (spare.SweepPools), logging what it could not.
func sweepPools(ctx context.Context, parent string) {
	if err := spare.SweepPools(parent); err != nil {
		log.G(ctx).WithError(err).Warn("sweep pooled VMs' run dirs")
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
	prefix := baseimage.Key(spare.PoolPrefix)
	ls, err := client.LeasesService().List(ctx, `id~="^`+regexp.QuoteMeta(prefix)+`"`)
	if err != nil {
		log.G(ctx).WithError(err).Warn("list the leases of pooled VMs' base snapshots")
		return
	}
	for _, l := range ls {
		pid, err := strconv.Atoi(strings.TrimPrefix(l.ID, prefix))
		if err != nil || pid == os.Getpid() || spare.Runs(pid) {
			continue
		}
		if err := client.LeasesService().Delete(ctx, l, leases.SynchronousDelete); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("lease", l.ID).Warn("delete the lease of a dead spare's pooled VM")
		}
	}
}
