package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// procRoot is the proc file system Processes and Stats read.
var procRoot = "/proc"

// userHZ is the unit of /proc/stat's CPU times.
const userHZ = 100

const (
	// maxCommandLen bounds the command of one process in a Processes
	// reply, as ps cuts what it shows: any guest user can start a process
	// whose command line is megabytes long.
	maxCommandLen = 4 << 10
	// maxProcessesSize bounds a whole Processes reply, well under ttrpc's
	// message limit; the processes past it are counted, not listed.
	maxProcessesSize = 1 << 20
)

// Processes lists the guest's user processes: not kernel threads, not init,
// not the agent itself. Commands longer than maxCommandLen are cut, and
// processes past maxProcessesSize are only counted.
func (s *Service) Processes(ctx context.Context, _ *emptypb.Empty) (*api.ProcessesResponse, error) {
	ids := s.pidIDs()
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	self := uint32(os.Getpid())
	resp := &api.ProcessesResponse{}
	size := 0
	for _, e := range entries {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || uint32(pid) == self || pid == 1 {
			continue
		}
		info, ok := readProcess(uint32(pid))
		if !ok {
			continue // gone meanwhile, or a kernel thread
		}
		info.Id = ids[info.Pid]
		if size += listedSize(info); size > maxProcessesSize {
			resp.Omitted++
			continue
		}
		resp.Processes = append(resp.Processes, info)
	}
	if resp.Omitted > 0 {
		log.G(ctx).WithField("omitted", resp.Omitted).Warn("process list cut to bound its reply")
	}
	return resp, nil
}

// listedSize is what info adds to a ProcessesResponse on the wire.
func listedSize(info *api.ProcessInfo) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(info))
}

func (s *Service) pidIDs() map[uint32]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make(map[uint32]string, len(s.procs))
	for id, p := range s.procs {
		if p == nil || p.exited() {
			continue
		}
		if pid := p.pid(); pid != 0 {
			ids[uint32(pid)] = id
		}
	}
	return ids
}

// readProcess reads /proc/PID/stat and cmdline.
func readProcess(pid uint32) (*api.ProcessInfo, bool) {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return nil, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return nil, false
	}
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < 2 {
		return nil, false
	}
	ppid, _ := strconv.ParseUint(fields[1], 10, 32)
	cmd, cut, ok := readCommand(filepath.Join(dir, "cmdline"))
	if !ok {
		return nil, false
	}
	return &api.ProcessInfo{Pid: pid, Ppid: uint32(ppid), Command: cmd, CommandTruncated: cut}, true
}

// readCommand reads a process's command line, its arguments joined by
// spaces, as valid UTF-8 (protobuf refuses to send a string that is not),
// and at most maxCommandLen bytes of it; cut says it was longer. A kernel
// thread has none: ok is false, as it is when the process is gone.
func readCommand(path string) (cmd string, cut, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false, false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCommandLen+1))
	if err != nil || len(b) == 0 {
		return "", false, false
	}
	if cut = len(b) > maxCommandLen; cut {
		b = b[:maxCommandLen]
	} else {
		b = bytes.TrimRight(b, "\x00")
	}
	cmd = strings.ToValidUTF8(strings.ReplaceAll(string(b), "\x00", " "), "\uFFFD")
	if len(cmd) > maxCommandLen {
		// Replacement characters outgrew what they replaced.
		cmd, cut = cutUTF8(cmd, maxCommandLen), true
	}
	return cmd, cut, true
}

// Stats reports memory, CPU time, load and uptime.
func (s *Service) Stats(ctx context.Context, _ *emptypb.Empty) (*api.StatsResponse, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return nil, fmt.Errorf("sysinfo: %w", err)
	}
	unit := uint64(si.Unit)
	resp := &api.StatsResponse{
		MemoryTotal: uint64(si.Totalram) * unit,
		MemoryFree:  uint64(si.Freeram) * unit,
		Load1:       float64(si.Loads[0]) / (1 << unix.SI_LOAD_SHIFT),
		Load5:       float64(si.Loads[1]) / (1 << unix.SI_LOAD_SHIFT),
		Load15:      float64(si.Loads[2]) / (1 << unix.SI_LOAD_SHIFT),
		Processes:   uint32(si.Procs),
		UptimeNs:    uint64(time.Duration(si.Uptime) * time.Second),
	}
	var err error
	if resp.MemoryAvailable, err = memAvailable(); err != nil {
		return nil, err
	}
	if err := readCPU(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func memAvailable() (uint64, error) {
	f, err := os.Open(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return 0, fmt.Errorf("read meminfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse MemAvailable %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("meminfo has no MemAvailable line")
}

// readCPU fills the CPU times from the first line of /proc/stat:
// "cpu user nice system idle ...", in USER_HZ ticks.
func readCPU(resp *api.StatsResponse) error {
	b, err := os.ReadFile(filepath.Join(procRoot, "stat"))
	if err != nil {
		return fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return fmt.Errorf("parse /proc/stat: unexpected first line %q", line)
	}
	var ticks [4]uint64
	for i := range ticks {
		if ticks[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return fmt.Errorf("parse /proc/stat %q: %w", line, err)
		}
	}
	ns := func(t uint64) uint64 { return t * uint64(time.Second/userHZ) }
	resp.CpuUserNs = ns(ticks[0] + ticks[1])
	resp.CpuSystemNs = ns(ticks[2])
	resp.CpuIdleNs = ns(ticks[3])
	return nil
}
