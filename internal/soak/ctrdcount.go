package soak

import (
	"context"
	"fmt"
	"slices"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/devstack"
)

// containerdCounts are containerd's leases, its snapshots on the cocoon
// snapshotter, its containers and tasks, in every namespace, and the
// snapshots the snapshotter itself holds.
func (s *soak) containerdCounts(ctx context.Context) (Census, error) {
	nss, err := s.client.NamespaceService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var ls, snaps, ctrs, tasks []string
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		got, err := s.client.LeasesService().List(nctx)
		if err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		for _, l := range got {
			ls = append(ls, ns+"/"+l.ID)
		}
		err = s.client.SnapshotService(devstack.Snapshotter).Walk(nctx, func(_ context.Context, info snapshots.Info) error {
			snaps = append(snaps, fmt.Sprintf("%s/%s (%s)", ns, info.Name, info.Kind))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		cs, err := s.client.Containers(nctx)
		if err != nil {
			return nil, fmt.Errorf("list containers: %w", err)
		}
		for _, c := range cs {
			ctrs = append(ctrs, ns+"/"+c.ID())
		}
		ts, err := s.client.TaskService().List(nctx, &tasksapi.ListTasksRequest{})
		if err != nil {
			return nil, fmt.Errorf("list tasks: %w", err)
		}
		for _, t := range ts.Tasks {
			tasks = append(tasks, fmt.Sprintf("%s/%s pid %d %s", ns, t.ID, t.Pid, t.Status))
		}
	}
	own, err := s.snapshotterKeys(ctx)
	if err != nil {
		return nil, err
	}
	for _, l := range [][]string{ls, snaps, ctrs, tasks} {
		slices.Sort(l)
	}
	return Census{
		itemsCount(CountLeases, ls),
		itemsCount(CountSnapshots, snaps),
		itemsCount(CountSnapshotterDB, own),
		itemsCount(CountContainers, ctrs),
		itemsCount(CountTasks, tasks),
	}, nil
}

// dialSnapshotter connects to the snapshotter's socket, once for the
// soak's life: a connection per census would move its descriptor count.
func dialSnapshotter(address string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to the snapshotter: %w", err)
	}
	return conn, nil
}

// snapshotterKeys lists the snapshots in the snapshotter's own metadata,
// asked over its socket.
func (s *soak) snapshotterKeys(ctx context.Context) ([]string, error) {
	var out []string
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(s.snConn), devstack.Snapshotter)
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		out = append(out, fmt.Sprintf("%s (%s)", info.Name, info.Kind))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the snapshotter's snapshots: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// collectGarbage makes containerd collect garbage now: deleting a lease
// synchronously runs its collector before returning.
func (s *soak) collectGarbage(ctx context.Context) error {
	ctx = namespaces.WithNamespace(ctx, s.stack.Namespace)
	ls := s.client.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		return fmt.Errorf("collect garbage: %w", err)
	}
	return nil
}
