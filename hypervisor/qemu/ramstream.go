package qemu

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// QEMU 7.2's migration stream, as far as removing guest RAM from it needs
// (migration/savevm.c and migration/ram.c of v7.2.0). A cocoon VM migrates
// with x-ignore-shared and nothing else, so the stream is:
//
//	magic "QEVM", version 3
//	configuration (0x07): machine name, subsections (capabilities, ...)
//	RAM: start (0x01) with the block list, parts (0x02), end (0x03); each
//	    section's data is RAM records up to EOS, then a footer (0x7e, id)
//	device sections (0x04), EOF (0x00), the JSON description (0x06)
//
// A RAM record is a big-endian uint64 of the page's offset in its block
// with flags in the low bits, the block's name unless CONTINUE says it is
// the previous record's block, then one fill byte (ZERO) or the page
// (PAGE). Only the RAM sections are parsed: device sections are not
// self-delimiting, but nothing in them or after them is RAM.
const (
	streamMagic   = 0x5145564d
	streamVersion = 3

	sectionStart      = 0x01
	sectionPart       = 0x02
	sectionEnd        = 0x03
	sectionFull       = 0x04
	sectionSubsection = 0x05
	sectionConfig     = 0x07
	sectionEOF        = 0x00
	sectionFooter     = 0x7e

	ramZero     = 0x02
	ramMemSize  = 0x04
	ramPage     = 0x08
	ramEOS      = 0x10
	ramContinue = 0x20
	// ramFlagMask is the bits below a target page: flags, not offset.
	ramFlagMask = targetPageSize - 1

	targetPageSize = 4096
	ramSection     = "ram"
)

// ramBlock is one entry of the RAM section's block list.
type ramBlock struct {
	ID     string
	Length int64
}

// ramStats is what a pass over a stream found.
type ramStats struct {
	// Blocks is the RAM section's block list.
	Blocks []ramBlock
	// Dropped counts the removed page records (the guest RAM's); Kept the
	// other blocks' (firmware, ACPI tables), which stay.
	Dropped, Kept int64
}

// block returns the listed block named id.
func (s ramStats) block(id string) (ramBlock, bool) {
	for _, b := range s.Blocks {
		if b.ID == id {
			return b, true
		}
	}
	return ramBlock{}, false
}

// filterRAM copies the migration stream src to dst without the page
// records of the RAM block guestRAM, keeping the RAM sections themselves
// (block list, other blocks' pages, EOS markers, footers) and every other
// section byte for byte. With dst io.Discard it checks a stream. Its 1 MiB
// buffers keep a live migration's stream draining.
func filterRAM(dst io.Writer, src io.Reader, guestRAM string) (ramStats, error) {
	return runFilter(bufio.NewReaderSize(src, 1<<20), bufio.NewWriterSize(dst, 1<<20), guestRAM)
}

// scanRAM reads a device-state file as filterRAM does, writing nothing.
// Every restore scans its state before QEMU starts: small buffers, since
// first touching 1 MiB ones cost 1–3 ms there, for a file of some 64 KiB.
func scanRAM(src io.Reader, guestRAM string) (ramStats, error) {
	return runFilter(bufio.NewReaderSize(src, 64<<10), bufio.NewWriter(io.Discard), guestRAM)
}

func runFilter(r *bufio.Reader, w *bufio.Writer, guestRAM string) (ramStats, error) {
	f := &ramFilter{r: r, w: w, guestRAM: guestRAM}
	err := f.run()
	if ferr := f.w.Flush(); err == nil {
		err = ferr
	}
	return f.stats, err
}

type ramFilter struct {
	r        *bufio.Reader
	w        *bufio.Writer
	guestRAM string
	stats    ramStats

	ramID          uint32
	started, ended bool
	// lastIn and lastOut are the blocks of the previous record read and
	// written: CONTINUE refers to them.
	lastIn, lastOut string
	page            [targetPageSize]byte
	err             error
}

func (f *ramFilter) run() error {
	if magic, version := f.u32(), f.u32(); f.err != nil || magic != streamMagic || version != streamVersion {
		return f.fail(fmt.Errorf("not a QEMU migration stream of version %d (magic %#x, version %d)", streamVersion, magic, version))
	}
	f.put32(streamMagic)
	f.put32(streamVersion)
	for f.err == nil {
		t := f.u8()
		switch {
		case f.err != nil:
			return f.err
		case t == sectionConfig:
			f.put8(t)
			f.config()
		case t == sectionStart:
			f.start()
		case t == sectionPart || t == sectionEnd:
			f.part(t)
		case t == sectionFull || t == sectionEOF:
			if !f.ended {
				return fmt.Errorf("section type %#x before the RAM section ended", t)
			}
			f.put8(t)
			if _, err := io.Copy(f.w, f.r); err != nil {
				return fmt.Errorf("copy device state: %w", err)
			}
			return nil
		default:
			return fmt.Errorf("section type %#x: not one a cocoon VM's migration writes", t)
		}
	}
	return f.err
}

// config passes the configuration section: the machine name, then its
// subsections, whose contents savevm.c's vmstate_configuration fixes.
func (f *ramFilter) config() {
	n := f.u32()
	if f.err == nil && n > 255 {
		f.fail(fmt.Errorf("configuration names a machine of %d bytes", n))
		return
	}
	f.put32(n)
	f.passN(int(n))
	for f.err == nil {
		b, err := f.r.Peek(1)
		if err != nil || b[0] != sectionSubsection {
			return
		}
		f.put8(f.u8())
		name := f.idstr()
		f.putIDStr(name)
		f.put32(f.u32()) // version
		switch name {
		case "configuration/target-page-bits":
			f.put32(f.u32())
		case "configuration/uuid":
			f.passN(16)
		case "configuration/capabilities":
			n := f.u32()
			if n > 64 {
				f.fail(fmt.Errorf("configuration lists %d capabilities", n))
				return
			}
			f.put32(n)
			for range n {
				f.putIDStr(f.idstr())
			}
		default:
			f.fail(fmt.Errorf("configuration subsection %q: not one QEMU 7.2 writes", name))
		}
	}
}

func (f *ramFilter) start() {
	id, name, instance, version := f.u32(), f.idstr(), f.u32(), f.u32()
	switch {
	case f.err != nil:
		return
	case name != ramSection:
		f.fail(fmt.Errorf("iterative section %q: only RAM is iterative in a cocoon VM", name))
		return
	case f.started:
		f.fail(errors.New("a second RAM section starts"))
		return
	}
	f.started, f.ramID = true, id
	f.put8(sectionStart)
	f.put32(id)
	f.putIDStr(name)
	f.put32(instance)
	f.put32(version)
	f.ramData()
}

func (f *ramFilter) part(t byte) {
	id := f.u32()
	switch {
	case f.err != nil:
		return
	case !f.started || f.ended || id != f.ramID:
		f.fail(fmt.Errorf("section %d (type %#x) is not the open RAM section", id, t))
		return
	}
	f.put8(t)
	f.put32(id)
	f.ramData()
	f.ended = t == sectionEnd
}

// ramData passes one RAM section's records up to EOS and its footer.
func (f *ramFilter) ramData() {
	for f.err == nil {
		v := f.u64()
		flags, off := v&ramFlagMask, v&^ramFlagMask
		switch kind := flags &^ ramContinue; {
		case f.err != nil:
			return
		case flags == ramEOS:
			f.put64(v)
			f.footer()
			return
		case flags == ramMemSize:
			f.put64(v)
			f.blockList(int64(off))
		case kind == ramZero || kind == ramPage:
			f.record(flags, off)
		default:
			f.fail(fmt.Errorf("RAM record flags %#x at %#x: compression, XBZRLE, multifd and postcopy are never on in a cocoon VM", flags, off))
		}
	}
}

// blockList passes the block list: name, used length and (x-ignore-shared
// is always on) guest address of each block, until total is covered.
func (f *ramFilter) blockList(total int64) {
	for total > 0 && f.err == nil {
		name := f.idstr()
		length, addr := f.u64(), f.u64()
		if f.err == nil && (length == 0 || length > uint64(total)) {
			f.fail(fmt.Errorf("RAM block %q of %d bytes does not fit the %d bytes left of the RAM size", name, length, total))
			return
		}
		f.putIDStr(name)
		f.put64(length)
		f.put64(addr)
		f.stats.Blocks = append(f.stats.Blocks, ramBlock{ID: name, Length: int64(length)})
		total -= int64(length)
	}
}

// record passes or drops one page record. Written records name their
// block again whenever the previous record written was another block's.
func (f *ramFilter) record(flags, off uint64) {
	block := f.lastIn
	if flags&ramContinue == 0 {
		block = f.idstr()
	}
	if f.err == nil && block == "" {
		f.fail(fmt.Errorf("RAM record at %#x continues a block before any was named", off))
	}
	if _, ok := f.stats.block(block); f.err == nil && !ok {
		f.fail(fmt.Errorf("RAM record at %#x names block %q, not in the block list", off, block))
	}
	f.lastIn = block
	payload := f.page[:1]
	if flags&^ramContinue == ramPage {
		payload = f.page[:]
	}
	if _, err := io.ReadFull(f.r, payload); err != nil {
		f.fail(fmt.Errorf("read RAM record at %#x of %q: %w", off, block, err))
	}
	if f.err != nil {
		return
	}
	if block == f.guestRAM {
		f.stats.Dropped++
		return
	}
	f.stats.Kept++
	hdr := off | flags&^ramContinue
	if block == f.lastOut {
		f.put64(hdr | ramContinue)
	} else {
		f.put64(hdr)
		f.putIDStr(block)
	}
	f.lastOut = block
	f.write(payload)
}

func (f *ramFilter) footer() {
	if t, id := f.u8(), f.u32(); f.err == nil && (t != sectionFooter || id != f.ramID) {
		f.fail(fmt.Errorf("RAM section %d ends without its footer (%#x %d)", f.ramID, t, id))
		return
	}
	f.put8(sectionFooter)
	f.put32(f.ramID)
}

// fail records the first error.
func (f *ramFilter) fail(err error) error {
	if f.err == nil {
		f.err = err
	}
	return f.err
}

func (f *ramFilter) read(n int) []byte {
	if f.err != nil {
		return nil
	}
	b := f.page[:n]
	if _, err := io.ReadFull(f.r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		f.fail(fmt.Errorf("read migration stream: %w", err))
		return nil
	}
	return b
}

func (f *ramFilter) u8() byte {
	if b := f.read(1); b != nil {
		return b[0]
	}
	return 0
}

func (f *ramFilter) u32() uint32 {
	if b := f.read(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (f *ramFilter) u64() uint64 {
	if b := f.read(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// idstr reads a name: one length byte, then the bytes.
func (f *ramFilter) idstr() string {
	n := f.u8()
	return string(f.read(int(n)))
}

// passN copies n bytes (n ≤ a page) unchanged.
func (f *ramFilter) passN(n int) { f.write(f.read(n)) }

func (f *ramFilter) write(b []byte) {
	if f.err != nil {
		return
	}
	if _, err := f.w.Write(b); err != nil {
		f.fail(fmt.Errorf("write filtered stream: %w", err))
	}
}

func (f *ramFilter) put8(v byte) { f.write([]byte{v}) }

func (f *ramFilter) put32(v uint32) { f.write(binary.BigEndian.AppendUint32(nil, v)) }

func (f *ramFilter) put64(v uint64) { f.write(binary.BigEndian.AppendUint64(nil, v)) }

func (f *ramFilter) putIDStr(s string) {
	f.put8(byte(len(s)))
	f.write([]byte(s))
}

// checkState checks the device state a restore will load: a stream
// filterRAM parses, whose block list has the guest RAM at the chain's
// memory size, and that carries none of the guest RAM's pages (the chain's
// memory is the guest's; pages in the stream would overwrite it).
func checkState(path string, top *chain.Link) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open device state: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("device state %s is not a regular file (%v)", path, err)
	}
	stats, err := scanRAM(f, ramID)
	if err != nil {
		return fmt.Errorf("device state %s: %w", path, err)
	}
	b, ok := stats.block(ramID)
	switch {
	case !ok:
		return fmt.Errorf("device state %s has no %s block", path, ramID)
	case b.Length != top.MemoryBytes:
		return fmt.Errorf("device state %s: %s is %d bytes, the chain's memory %d: the snapshot's layout changed", path, ramID, b.Length, top.MemoryBytes)
	case stats.Dropped > 0:
		return fmt.Errorf("device state %s carries %d pages of guest RAM (link stateMemory %q): the chain's memory must be the guest's only memory", path, stats.Dropped, top.StateMemory)
	}
	return nil
}
