package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cloneMemory is what one clone costs in memory, in KiB.
//   - pss: its proportional set size; shared pages (the page cache of an
//     mmap-restored memory file) are split among the processes mapping them.
//     PSS counts only touched pages, so a copy restore's guest RAM in a
//     memfd is mostly missing from it.
//   - held: pss with a copy's whole memfd in place of its touched share.
//   - guest: the guest RAM alone: the PSS of the guest RAM mapping, or the
//     memfd's allocated size if larger. The rest of pss is QEMU itself (under
//     TCG mostly its translated-code buffer). 0 for a container without a
//     guest (runc).
type cloneMemory struct {
	pss, held, guest int64
}

// readCloneMemory reads the memory of process pid, whose guest RAM is a
// mapping of guestKiB (0: it has none).
func readCloneMemory(pid int, guestKiB int64) (cloneMemory, error) {
	rollup, err := smapsFields(pid, "smaps_rollup")
	if err != nil {
		return cloneMemory{}, err
	}
	if guestKiB == 0 {
		return cloneMemory{pss: rollup["Pss"], held: rollup["Pss"]}, nil
	}
	memfd, err := memfdKiB(pid)
	if err != nil {
		return cloneMemory{}, err
	}
	ram, err := mappingPss(pid, guestKiB)
	if err != nil {
		return cloneMemory{}, err
	}
	held := rollup["Pss"]
	if memfd > 0 {
		// The memfd's touched pages are shmem: count the whole memfd instead.
		held += memfd - rollup["Pss_Shmem"]
	}
	return cloneMemory{pss: rollup["Pss"], held: held, guest: max(ram, memfd)}, nil
}

// smapsFields returns the kB fields of /proc/pid/<name> (smaps_rollup).
func smapsFields(pid int, name string) (map[string]int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), name))
	if err != nil {
		return nil, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	fields := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := kbField(line); ok {
			fields[k] = v
		}
	}
	if _, ok := fields["Pss"]; !ok {
		return nil, fmt.Errorf("read memory of pid %d: no Pss in %s", pid, name)
	}
	return fields, nil
}

// kbField parses a "Name:   123 kB" line.
func kbField(line string) (string, int64, bool) {
	f := strings.Fields(line)
	if len(f) != 3 || f[2] != "kB" || !strings.HasSuffix(f[0], ":") {
		return "", 0, false
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return strings.TrimSuffix(f[0], ":"), n, true
}

// mappingPss is the PSS of pid's mapping of exactly sizeKiB: the guest RAM.
func mappingPss(pid int, sizeKiB int64) (int64, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "smaps"))
	if err != nil {
		return 0, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inRAM := false
	for sc.Scan() {
		k, v, ok := kbField(sc.Text())
		switch {
		case !ok:
		case k == "Size":
			inRAM = v == sizeKiB
		case k == "Pss" && inRAM:
			return v, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	return 0, fmt.Errorf("pid %d has no %d KiB guest RAM mapping", pid, sizeKiB)
}

// memfdKiB is the memory allocated to the memfds pid holds: a copy
// restore's guest RAM.
func memfdKiB(pid int) (int64, error) {
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	des, err := os.ReadDir(fdDir)
	if err != nil {
		return 0, fmt.Errorf("list fds of pid %d: %w", pid, err)
	}
	var total int64
	seen := map[uint64]bool{} // QEMU reopens the memfd we pass it
	for _, de := range des {
		p := filepath.Join(fdDir, de.Name())
		if target, err := os.Readlink(p); err != nil || !strings.HasPrefix(target, "/memfd:") {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil && !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512 / 1024
		}
	}
	return total, nil
}
