package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// nsRef is one way to reach a network namespace: a path and who holds it.
type nsRef struct {
	path, holder string
}

// network counts the soak's taps (by their names, in every namespace the
// stack's processes, the host or a live pair hold) and the network
// namespaces other than the host's that those hold.
func (s *soak) network(procs []proc) (taps, namespaces []string, err error) {
	hostIno, err := inode("/proc/self/ns/net")
	if err != nil {
		return nil, nil, fmt.Errorf("host network namespace: %w", err)
	}
	byIno := map[uint64][]nsRef{hostIno: {{path: "/proc/self/ns/net", holder: "host"}}}
	add := func(path, holder string) {
		if ino, err := inode(path); err == nil {
			byIno[ino] = append(byIno[ino], nsRef{path: path, holder: holder})
		}
	}
	for _, p := range s.pairs.paths() {
		add(p, "soak namespace "+p)
	}
	for _, p := range procs {
		add(fmt.Sprintf("/proc/%d/ns/net", p.pid), fmt.Sprintf("pid %d (%s)", p.pid, p.name()))
		for _, fd := range netnsFDs(p.pid) {
			add(fd, fmt.Sprintf("fd of pid %d (%s)", p.pid, p.name()))
		}
	}
	for ino, refs := range byIno {
		if ino != hostIno {
			namespaces = append(namespaces, fmt.Sprintf("net:[%d] held by %s", ino, holders(refs)))
		}
		found, err := s.tapsIn(refs)
		if err != nil {
			return nil, nil, err
		}
		for _, t := range found {
			taps = append(taps, fmt.Sprintf("tap %s in net:[%d] (%s)", t, ino, holders(refs)))
		}
	}
	slices.Sort(taps)
	slices.Sort(namespaces)
	return taps, namespaces, nil
}

// tapsIn lists the soak's taps in the namespace refs reach, through the
// first ref that still opens (a process may be gone meanwhile).
func (s *soak) tapsIn(refs []nsRef) ([]string, error) {
	for _, r := range refs {
		h, err := handleAt(r.path)
		if err != nil {
			continue
		}
		links, err := h.LinkList()
		h.Close()
		if err != nil {
			return nil, fmt.Errorf("list links of %s: %w", r.holder, err)
		}
		var out []string
		for _, l := range links {
			if _, ours := s.tapNames[l.Attrs().Name]; ours && l.Type() == "tuntap" {
				out = append(out, l.Attrs().Name)
			}
		}
		return out, nil
	}
	return nil, nil
}

func holders(refs []nsRef) string {
	hs := make([]string, 0, len(refs))
	for _, r := range refs {
		hs = append(hs, r.holder)
	}
	slices.Sort(hs)
	return strings.Join(slices.Compact(hs), ", ")
}

// netnsFDs lists pid's descriptors that hold a network namespace.
func netnsFDs(pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	des, _ := os.ReadDir(dir)
	var out []string
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, "net:[") {
			out = append(out, p)
		}
	}
	return out
}

func inode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
