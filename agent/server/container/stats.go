package container

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// cgroupStats reads the cgroup v2 group at path (under cgroupRoot) as
// containerd's cgroups v2 Metrics, the type containerd's CRI decodes. The
// files are read here, not through cgroups/v3's cgroup2 manager, which
// would triple the agent's size (dbus, ebpf) for a few reads.
func cgroupStats(path string) (*anypb.Any, error) {
	if cgroups.Mode() != cgroups.Unified {
		return nil, fmt.Errorf("container stats are read from cgroup v2, the guest's; this system has v1: %w", errdefs.ErrFailedPrecondition)
	}
	dir := filepath.Join(cgroupRoot, path)
	r := &statReader{dir: dir}
	m := &stats.Metrics{
		Pids:         &stats.PidsStat{Current: r.single("pids.current"), Limit: r.single("pids.max")},
		CPU:          r.cpu(),
		Memory:       r.memory(),
		MemoryEvents: r.events(),
	}
	if r.err != nil {
		return nil, fmt.Errorf("read cgroup %s: %w", path, r.err)
	}
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal stats: %w", err)
	}
	// The type URL as containerd's typeurl writes it.
	return &anypb.Any{TypeUrl: string(m.ProtoReflect().Descriptor().FullName()), Value: data}, nil
}

// statReader reads a cgroup's files, keeping the first error; a file a
// controller not enabled would have is read as zeros.
type statReader struct {
	dir string
	err error
}

func (r *statReader) read(name string) []byte {
	data, err := os.ReadFile(filepath.Join(r.dir, name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) && r.err == nil {
		r.err = err
	}
	return data
}

// single reads a one-value file; "max" is no limit.
func (r *statReader) single(name string) uint64 {
	s := strings.TrimSpace(string(r.read(name)))
	if s == "max" {
		return math.MaxUint64
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// keyed reads a file of "key value" lines.
func (r *statReader) keyed(name string) map[string]uint64 {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(r.read(name)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok {
			out[k], _ = strconv.ParseUint(v, 10, 64)
		}
	}
	return out
}

func (r *statReader) cpu() *stats.CPUStat {
	c := r.keyed("cpu.stat")
	return &stats.CPUStat{
		UsageUsec: c["usage_usec"], UserUsec: c["user_usec"], SystemUsec: c["system_usec"],
		NrPeriods: c["nr_periods"], NrThrottled: c["nr_throttled"], ThrottledUsec: c["throttled_usec"],
		NrBursts: c["nr_bursts"], BurstUsec: c["burst_usec"],
	}
}

func (r *statReader) memory() *stats.MemoryStat {
	m := r.keyed("memory.stat")
	return &stats.MemoryStat{
		Anon: m["anon"], File: m["file"], KernelStack: m["kernel_stack"], Slab: m["slab"],
		Sock: m["sock"], Shmem: m["shmem"], FileMapped: m["file_mapped"], FileDirty: m["file_dirty"],
		FileWriteback: m["file_writeback"], AnonThp: m["anon_thp"],
		InactiveAnon: m["inactive_anon"], ActiveAnon: m["active_anon"],
		InactiveFile: m["inactive_file"], ActiveFile: m["active_file"], Unevictable: m["unevictable"],
		SlabReclaimable: m["slab_reclaimable"], SlabUnreclaimable: m["slab_unreclaimable"],
		Pgfault: m["pgfault"], Pgmajfault: m["pgmajfault"],
		Usage: r.single("memory.current"), UsageLimit: r.single("memory.max"), MaxUsage: r.single("memory.peak"),
		SwapUsage: r.single("memory.swap.current"), SwapLimit: r.single("memory.swap.max"),
	}
}

func (r *statReader) events() *stats.MemoryEvents {
	e := r.keyed("memory.events")
	return &stats.MemoryEvents{Low: e["low"], High: e["high"], Max: e["max"], Oom: e["oom"], OomKill: e["oom_kill"]}
}
