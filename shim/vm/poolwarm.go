package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/agent/pause"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/spare"
)

// warmID names the warm-up's processes in the guest.
const warmID = "pool-warm"

// warmRootfsScript mounts the rootfs slot ($1 its serial) as the agent
// mounts a container's root (erofs under an overlay on a tmpfs, then
// proc, a dev tmpfs with devpts, shm and mqueue, a read-only sysfs, a
// masked file and a read-only path), then takes it all down. The kernel
// code it runs is what a task's Init runs next; the image it reads is
// the warm-up's own, empty.
const warmRootfsScript = `set -e
d=
for b in /sys/block/vd*; do [ "$(cat $b/serial)" = "$1" ] && d=${b##*/}; done
w=/run/cocoon-warm
r=$w/root
mkdir -p $w/lower $w/rw $r
mount -t erofs -o ro /dev/$d $w/lower
mount -t tmpfs tmpfs $w/rw
mkdir $w/rw/upper $w/rw/work
mount -t overlay overlay -o lowerdir=$w/lower,upperdir=$w/rw/upper,workdir=$w/rw/work $r
mount -t proc proc $r/proc
mount -t tmpfs -o nosuid,mode=755 tmpfs $r/dev
mkdir $r/dev/pts $r/dev/shm $r/dev/mqueue
mount -t devpts -o newinstance devpts $r/dev/pts
mount -t tmpfs shm $r/dev/shm
mount -t mqueue mqueue $r/dev/mqueue
mount -t sysfs -o ro sysfs $r/sys
mount --bind /dev/null $r/proc/kcore
mount --bind $r/proc/sys $r/proc/sys
mount -o remount,bind,ro $r/proc/sys
for m in proc/sys proc/kcore sys dev/mqueue dev/shm dev/pts dev proc; do umount $r/$m; done
umount $r $w/rw $w/lower
rm -rf $w
`

// warm runs in the pooled guest what every task's start runs for the
// first time after a restore, which under TCG is code translated anew:
// a container root's mounts (warmRootfs), the agent's Init (Init may be
// given again) preparing a process as containerd's default spec has it
// (capabilities, rlimits, no_new_privileges, the default seccomp profile,
// compiled in the guest) and configuring the NIC (warmNetwork), its
// start, fork, exec and wait, and an Init after a process has run (the
// NIC flushed and taken down, the process detached);
// for a pod's VM (warmContainers) a throwaway container too, made as a
// pod's first container joins (warmJoin) or, without a slot for it, by
// the agent as after a pod VM's restore, and the pod's pause (warmPause).
// The task's Init then pays for its own steps only (measured: Init 272 ->
// 61 ms, a held process's start 46 -> 8 ms), a pod's first container for
// its own. Each step runs unless a task has claimed the VM, which waits
// for the step under way (claim); a claimed VM's errors are not the
// warm-up's.
func (pv *pooledVM) warm(ctx context.Context) error {
	proc, err := warmProcess(ctx)
	if err != nil {
		return err
	}
	c := pv.res.Agent
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := c.Init(ctx, agent.InitRequest{Hostname: "pooled", Process: proc, Network: warmNetwork})
			return err
		},
		func(ctx context.Context) error { _, err := c.Start(ctx, proc.ID); return err },
		func(ctx context.Context) error { return exited(c.Wait(ctx, proc.ID)) },
		// After a process, or a network, the agent takes the NIC down and
		// flushes it at the next Init: this one, not the task's.
		func(ctx context.Context) error {
			warm := pv.warmContainers && pv.joinSerial == ""
			_, err := c.Init(ctx, agent.InitRequest{Hostname: "pooled", WarmContainers: warm, WarmOwnInit: pv.ownInit})
			pv.warmedContainers = pv.warmedContainers || err == nil && warm
			return err
		},
	}
	if pv.joinSerial != "" {
		steps = append(steps, pv.warmJoin)
	}
	if pv.warmContainers {
		steps = append(steps, pv.warmPause)
	}
	if pv.warmRootfs {
		// One step: a claim must not find the script's mounts of the slot.
		steps = append([]func(context.Context) error{func(ctx context.Context) error {
			const id = warmID + "-rootfs"
			if _, err := c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{"/bin/sh", "-c", warmRootfsScript, "sh", hypervisor.RootfsSerial}, Cwd: "/"}); err != nil {
				return err
			}
			return exited(c.Wait(ctx, id))
		}}, steps...)
	}
	for _, step := range steps {
		if done, err := pv.warmStep(ctx, step); done || err != nil {
			return err
		}
	}
	return nil
}

// exited is a warm-up process's failure, if it failed.
func exited(st agent.ExitStatus, err error) error {
	if err == nil && (st.Code != 0 || st.Signal != 0) {
		err = fmt.Errorf("exit status %d, signal %d", st.Code, st.Signal)
	}
	if err != nil {
		return fmt.Errorf("warm-up process: %w", err)
	}
	return nil
}

// warmStep runs step unless the VM is claimed (done). The VM runs at
// idle priority, so a busy machine may hold a step up for as long as it
// stays busy: that is no failure, and the step has no deadline of its
// own. A claim gives the VM its CPU back, and the step callTimeout then.
func (pv *pooledVM) warmStep(ctx context.Context, step func(context.Context) error) (done bool, err error) {
	pv.warming.Lock()
	defer pv.warming.Unlock()
	if pv.claimed {
		return true, nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go pv.boundOnClaim(ctx, cancel)
	err = step(ctx)
	// A step that ended as the claim's deadline came still ended.
	pv.cut = err != nil && errors.Is(context.Cause(ctx), errWarmCut)
	return false, err
}

// errWarmCut ends a warm-up step the claim waited callTimeout for.
var errWarmCut = errors.New("the warm-up step under way did not end in time for the claim")

// boundOnClaim cancels the step's ctx callTimeout after a claim begins.
func (pv *pooledVM) boundOnClaim(ctx context.Context, cancel context.CancelCauseFunc) {
	select {
	case <-pv.claiming:
	case <-ctx.Done():
		return
	}
	t := time.NewTimer(pv.callTimeout)
	defer t.Stop()
	select {
	case <-t.C:
		cancel(errWarmCut)
	case <-ctx.Done():
	}
}

// claim ends the warm-up once the hypervisor runs under the normal policy
// again, waiting for the step under way (callTimeout at most); a step
// that did not end leaves the guest halfway through it, and the VM
// unusable.
func (pv *pooledVM) claim(ctx context.Context) error {
	if err := spare.SetPolicy(pv.res.VM.PID(), unix.SCHED_NORMAL); err != nil {
		log.G(ctx).WithError(err).Warn("the pooled VM's hypervisor keeps the idle scheduling policy")
	}
	close(pv.claiming)
	pv.warming.Lock()
	defer pv.warming.Unlock()
	pv.claimed = true
	if pv.cut {
		return errWarmCut
	}
	return nil
}

// warmProcess is /bin/true as containerd's default spec runs a process.
func warmProcess(ctx context.Context) (*agent.ExecRequest, error) {
	ctx = namespaces.WithNamespace(ctx, "pool")
	spec, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: warmID})
	if err != nil {
		return nil, fmt.Errorf("default spec: %w", err)
	}
	p := spec.Process
	return &agent.ExecRequest{ID: warmID, Args: []string{"/bin/true"}, Cwd: "/", Rlimits: p.Rlimits,
		NoNewPrivileges: p.NoNewPrivileges, Capabilities: p.Capabilities, Seccomp: seccomp.DefaultProfile(spec)}, nil
}

// warmNetwork is what the warm-up's first Init gives the guest's NIC, on
// the pooled VM's tap alone in its namespace: an address and a default
// route of TEST-NET-1 (RFC 5737, documentation only), so that the task's
// Init configures a NIC along a path translated already. The next Init
// flushes it all and takes the NIC down.
var warmNetwork = &agent.Network{
	Addresses: []net.IPNet{{IP: net.IPv4(192, 0, 2, 2), Mask: net.CIDRMask(24, 32)}},
	Routes:    []agent.Route{{Gateway: net.IPv4(192, 0, 2, 1)}},
}

// warmJoinID names the container warmJoin makes.
const warmJoinID = warmID + "-join"

// warmJoin has the guest make a container as a pod's first container
// joins its VM (the image's erofs on a disk slot under an overlay,
// containerd's default mounts, namespaces, capabilities and seccomp
// profile, the container init held before its start) and remove it, and
// empties the slot again: under TCG that path, translated anew in each
// restored VM, is most of a pod's first join.
func (pv *pooledVM) warmJoin(ctx context.Context) error {
	spec, files, err := warmContainerSpec(ctx)
	if err != nil {
		return err
	}
	c := pv.res.Agent
	root := agent.ContainerRoot{Disk: &agent.Rootfs{FSType: "erofs", Serial: pv.joinSerial, Size: pv.joinSize}, Files: files, OwnInit: pv.ownInit}
	if _, err := c.CreateContainerFrom(ctx, warmJoinID, spec, root, false); err != nil {
		return fmt.Errorf("warm-up container: %w", err)
	}
	if err := c.DeleteContainer(ctx, warmJoinID, ""); err != nil {
		return fmt.Errorf("warm-up container: %w", err)
	}
	if err := c.UpdateFiles(ctx, nil, []string{memberBindSources(warmJoinID)}); err != nil {
		return fmt.Errorf("warm-up container's files: %w", err)
	}
	pv.warmedContainers = true
	return pv.res.VM.(hypervisor.DiskAttacher).DetachDisk(ctx, 0)
}

// warmPause runs the guest's pause once, for a pod's VM: under
// containerd's default sandboxer the pod's pause starts at the claim, and
// its start would otherwise be translated beside the pod's first
// container's create. A guest whose pause would wait instead is skipped.
func (pv *pooledVM) warmPause(ctx context.Context) error {
	c := pv.res.Agent
	if ok, err := c.WarmsPause(ctx); err != nil || !ok {
		return err
	}
	const id = warmID + "-pause"
	if _, err := c.Exec(ctx, agent.ExecRequest{ID: id, Args: []string{pause.Path, pause.WarmFlag}, Cwd: "/"}); err != nil {
		return fmt.Errorf("warm-up pause: %w", err)
	}
	return exited(c.Wait(ctx, id))
}

// warmContainerSpec is containerd's default spec for a container of a
// pod's VM (the VM's network is the pod's), with its default seccomp
// profile, running /proc/self/exe, which any root has once proc is
// mounted; and the files a container of a pod binds under containerd's
// default sandboxer (guestFiles, from the pod's dir), as a join has them
// copied in and bound (binds.copyOwn), so that path is translated too.
func warmContainerSpec(ctx context.Context) (*specs.Spec, []agent.File, error) {
	ctx = namespaces.WithNamespace(ctx, "pool")
	spec, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: warmJoinID}, oci.WithProcessArgs("/proc/self/exe"))
	if err != nil {
		return nil, nil, fmt.Errorf("default spec: %w", err)
	}
	spec.Linux.Seccomp = seccomp.DefaultProfile(spec)
	spec.Linux.Namespaces = slices.DeleteFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.NetworkNamespace })
	var files []agent.File
	for i, dst := range guestFiles {
		src := path.Join(memberBindSources(warmJoinID), strconv.Itoa(i))
		files = append(files, agent.File{Path: src, Data: []byte("\n")})
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", "rw"}})
	}
	return spec, files, nil
}

// attachWarmRootfs puts an empty erofs image (made with mkfs.erofs, as
// the snapshotter makes an image's) behind the pooled VM's rootfs slot,
// for warmRootfsScript, and for a pod's VM behind disk slot 0 too, for
// warmJoin; the claim puts the task's image there. QEMU keeps the image
// open, so its file goes at once. It is made in the VM's run dir, which
// the sweep of a killed spare's run dir takes with it.
func (pv *pooledVM) attachWarmRootfs(ctx context.Context) error {
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(pv.runDir, "warm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src, img := filepath.Join(dir, "root"), filepath.Join(dir, "root.erofs")
	for _, d := range []string{"proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			return err
		}
	}
	if out, err := exec.CommandContext(ctx, mkfs, "--quiet", img, src).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.erofs: %w: %s", err, out)
	}
	if err := pv.res.VM.(hypervisor.RootfsAttacher).AttachRootfs(ctx, img); err != nil {
		return err
	}
	pv.attachJoinSlot(ctx, img)
	return nil
}

// attachJoinSlot backs disk slot 0 of a pod's pooled VM with img, for
// warmJoin; without it the warm-up has the guest's agent make its own
// throwaway container.
func (pv *pooledVM) attachJoinSlot(ctx context.Context, img string) {
	disks, ok := pv.res.VM.(hypervisor.DiskAttacher)
	if !pv.warmContainers || !ok || disks.DiskSlots() == 0 {
		return
	}
	st, err := os.Stat(img)
	if err == nil {
		pv.joinSerial, err = disks.AttachDisk(ctx, 0, img)
	}
	if err != nil {
		log.G(ctx).WithError(err).Info("the pooled VM's warm-up joins no container")
		return
	}
	pv.joinSize = uint64(st.Size())
}
