package qemu

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// /proc/PID/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pagemapPresent = 1 << 63
	pagemapSwapped = 1 << 62
	// pagemapFile: the page is a file page or shared anonymous memory.
	pagemapFile = 1 << 61
)

// mapping is where a process maps a file: the address of the file's offset 0.
type mapping struct {
	addr uint64
	size int64
}

// fileMapping finds where pid maps the whole of f (size bytes) privately,
// matching /proc/PID/maps entries by device and inode. The mapping may be
// split into several entries; together they must map [0, size) of the file
// at consecutive addresses, once.
func fileMapping(pid int, f *os.File, size int64) (mapping, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return mapping{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	path := fmt.Sprintf("/proc/%d/maps", pid)
	maps, err := os.Open(path)
	if err != nil {
		return mapping{}, fmt.Errorf("read memory map: %w", err)
	}
	defer maps.Close()
	type vma struct{ start, end, off uint64 }
	var vmas []vma
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[3] != dev || fields[4] != strconv.FormatUint(st.Ino, 10) {
			continue
		}
		start, end, ok := strings.Cut(fields[0], "-")
		s, err1 := strconv.ParseUint(start, 16, 64)
		e, err2 := strconv.ParseUint(end, 16, 64)
		off, err3 := strconv.ParseUint(fields[2], 16, 64)
		if !ok || err1 != nil || err2 != nil || err3 != nil || len(fields[1]) != 4 || fields[1][3] != 'p' {
			return mapping{}, fmt.Errorf("%s: %q is not a private mapping line", path, sc.Text())
		}
		vmas = append(vmas, vma{s, e, off})
	}
	if err := sc.Err(); err != nil {
		return mapping{}, fmt.Errorf("read %s: %w", path, err)
	}
	slices.SortFunc(vmas, func(a, b vma) int { return cmp.Compare(a.off, b.off) })
	var covered uint64
	for i, v := range vmas {
		if v.off != covered || (i > 0 && v.start != vmas[i-1].end) {
			return mapping{}, fmt.Errorf("process %d maps %s in %d pieces that are not one mapping of the file", pid, f.Name(), len(vmas))
		}
		covered += v.end - v.start
	}
	if len(vmas) == 0 || covered != uint64(size) {
		return mapping{}, fmt.Errorf("process %d maps %d of the %d bytes of %s (want one private mapping of all of it)", pid, covered, size, f.Name())
	}
	return mapping{addr: vmas[0].start, size: size}, nil
}

// anonPages lists the pages of m in pid that are anonymous: in a private
// file mapping those are exactly the pages written since it was mapped
// (copy-on-write copies), present or swapped out. The pages are the host's
// and must be the guest's size too. buf (pagemapBufSize) holds the page
// map entries read at once.
func anonPages(pid int, m mapping, page int64, buf []byte) ([]chain.Extent, error) {
	if host := int64(os.Getpagesize()); host != page {
		return nil, fmt.Errorf("guest pages of %d bytes on a host with %d-byte pages", page, host)
	}
	path := fmt.Sprintf("/proc/%d/pagemap", pid)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read page map: %w", err)
	}
	defer f.Close()
	n := m.size / page
	var out []chain.Extent
	for i := int64(0); i < n; {
		k := min(n-i, int64(len(buf)/8))
		b := buf[:8*k]
		if _, err := f.ReadAt(b, int64(m.addr/uint64(page))*8+i*8); err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		for j := range k {
			e := binary.LittleEndian.Uint64(b[8*j:])
			if e&(pagemapPresent|pagemapSwapped) == 0 || e&pagemapFile != 0 {
				continue
			}
			off := (i + j) * page
			if last := len(out) - 1; last >= 0 && out[last].End() == off {
				out[last].Length += page
			} else {
				out = append(out, chain.Extent{Offset: off, Length: page})
			}
		}
		i += k
	}
	return out, nil
}

// pagemapBufSize is the buffer anonPages reads a memory of size bytes'
// page map entries through: all of them, up to 512 KiB (64 Ki pages).
func pagemapBufSize(size, page int64) int64 { return 8 * min(size/page, 1<<16) }
