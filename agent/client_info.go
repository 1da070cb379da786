package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// ProcessInfo is one process running in the guest.
type ProcessInfo struct {
	Pid     uint32
	PPid    uint32
	ID      string // the Exec id when the agent started it, else empty
	Command string
	// CommandTruncated says the agent cut Command to bound its reply.
	CommandTruncated bool
}

// ProcessList is the guest's processes as the agent listed them.
type ProcessList struct {
	Processes []ProcessInfo
	// Omitted counts the processes the agent left out to bound its reply.
	Omitted uint32
}

// Processes lists the guest's processes (not the kernel's threads, init or
// the agent).
func (c *Client) Processes(ctx context.Context) (ProcessList, error) {
	resp, err := c.api.Processes(ctx, &emptypb.Empty{})
	if err != nil {
		return ProcessList{}, fmt.Errorf("list guest processes: %w", native(err))
	}
	out := ProcessList{Processes: make([]ProcessInfo, 0, len(resp.Processes)), Omitted: resp.Omitted}
	for _, p := range resp.Processes {
		out.Processes = append(out.Processes, ProcessInfo{
			Pid: p.Pid, PPid: p.Ppid, ID: p.Id, Command: p.Command, CommandTruncated: p.CommandTruncated,
		})
	}
	return out, nil
}

// Stats is the guest's view of its memory, CPU time and load.
type Stats struct {
	MemoryTotal, MemoryFree, MemoryAvailable uint64 // bytes
	CPUUser, CPUSystem, CPUIdle              time.Duration
	Load1, Load5, Load15                     float64
	Processes                                uint32
	Uptime                                   time.Duration
}

// Stats reads the guest's resource usage.
func (c *Client) Stats(ctx context.Context) (*Stats, error) {
	r, err := c.api.Stats(ctx, &emptypb.Empty{})
	if err != nil {
		return nil, fmt.Errorf("read guest stats: %w", native(err))
	}
	return &Stats{
		MemoryTotal: r.MemoryTotal, MemoryFree: r.MemoryFree, MemoryAvailable: r.MemoryAvailable,
		CPUUser:   time.Duration(r.CpuUserNs),
		CPUSystem: time.Duration(r.CpuSystemNs),
		CPUIdle:   time.Duration(r.CpuIdleNs),
		Load1:     r.Load1, Load5: r.Load5, Load15: r.Load15,
		Processes: r.Processes,
		Uptime:    time.Duration(r.UptimeNs),
	}, nil
}

func isConnectionGone(err error) bool {
	return errors.Is(err, ttrpc.ErrClosed)
}
