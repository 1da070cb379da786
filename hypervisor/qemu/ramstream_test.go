package qemu

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// streamBuilder writes a migration stream the way QEMU 7.2 does, for the
// filter's tests. A real stream is tested in TestForkDiff.
type streamBuilder struct {
	bytes.Buffer
	last string
}

func (b *streamBuilder) u8(v byte)    { b.WriteByte(v) }
func (b *streamBuilder) u32(v uint32) { b.Write(binary.BigEndian.AppendUint32(nil, v)) }
func (b *streamBuilder) u64(v uint64) { b.Write(binary.BigEndian.AppendUint64(nil, v)) }
func (b *streamBuilder) id(s string)  { b.u8(byte(len(s))); b.WriteString(s) }

func (b *streamBuilder) header() {
	b.u32(streamMagic)
	b.u32(streamVersion)
	b.u8(sectionConfig)
	b.u32(7)
	b.WriteString("microvm")
	b.u8(sectionSubsection)
	b.id("configuration/capabilities")
	b.u32(1)
	b.u32(1)
	b.id("x-ignore-shared")
}

// start opens the RAM section (id 2) with blocks and their lengths.
func (b *streamBuilder) start(blocks ...ramBlock) {
	b.u8(sectionStart)
	b.u32(2)
	b.id(ramSection)
	b.u32(0)
	b.u32(4)
	var total int64
	for _, bl := range blocks {
		total += bl.Length
	}
	b.u64(uint64(total) | ramMemSize)
	for _, bl := range blocks {
		b.id(bl.ID)
		b.u64(uint64(bl.Length))
		b.u64(0)
	}
	b.eos()
}

// page writes a record as QEMU's save_page_header does: CONTINUE when the
// previous record was the same block's.
func (b *streamBuilder) page(block string, off uint64, data byte) {
	flags := uint64(ramPage)
	if data == 0 {
		flags = ramZero
	}
	if block == b.last {
		b.u64(off | flags | ramContinue)
	} else {
		b.u64(off | flags)
		b.id(block)
	}
	b.last = block
	if data == 0 {
		b.u8(0)
		return
	}
	b.Write(bytes.Repeat([]byte{data}, targetPageSize))
}

func (b *streamBuilder) eos() {
	b.u64(ramEOS)
	b.u8(sectionFooter)
	b.u32(2)
}

func (b *streamBuilder) part(t byte) {
	b.u8(t)
	b.u32(2)
}

// devices ends the stream with a device section and the EOF marker.
func (b *streamBuilder) devices() {
	b.u8(sectionFull)
	b.WriteString("\x00\x00\x00\x03\x06serial\x00\x00\x00\x00\x00\x00\x00\x01device bytes")
	b.u8(sectionEOF)
}

var testBlocks = []ramBlock{{ramID, 4 * targetPageSize}, {"pc.bios", 2 * targetPageSize}}

// Only the guest RAM's records go; the others are written again with
// CONTINUE only where the previous record written was their block's, and
// everything else is unchanged.
func TestFilterRAM(t *testing.T) {
	var in, want streamBuilder
	for _, b := range []*streamBuilder{&in, &want} {
		b.header()
		b.start(testBlocks...)
		b.part(sectionPart)
	}
	in.page("pc.bios", 0, 0xb1)
	in.page(ramID, 0, 0xaa)
	in.page(ramID, targetPageSize, 0)
	in.page("pc.bios", targetPageSize, 0) // names its block: the previous was RAM
	in.eos()
	in.part(sectionEnd)
	in.page(ramID, 2*targetPageSize, 0xcc)
	in.eos()
	in.devices()

	want.page("pc.bios", 0, 0xb1)
	want.page("pc.bios", targetPageSize, 0) // CONTINUE now
	want.eos()
	want.part(sectionEnd)
	want.eos()
	want.devices()

	var out bytes.Buffer
	st, err := filterRAM(&out, bytes.NewReader(in.Bytes()), ramID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dropped != 3 || st.Kept != 2 || len(st.Blocks) != 2 || st.Blocks[0] != testBlocks[0] {
		t.Errorf("stats %+v, want 3 dropped, 2 kept, blocks %v", st, testBlocks)
	}
	if !bytes.Equal(out.Bytes(), want.Bytes()) {
		t.Fatalf("filtered stream differs from the expected one:\n got % x\nwant % x", out.Bytes(), want.Bytes())
	}
	again, err := filterRAM(io.Discard, bytes.NewReader(out.Bytes()), ramID)
	if err != nil || again.Dropped != 0 || again.Kept != 2 {
		t.Fatalf("filtering the filtered stream: %+v, %v; want nothing dropped", again, err)
	}
}

func TestFilterRAMRejects(t *testing.T) {
	valid := func(b *streamBuilder) {
		b.header()
		b.start(testBlocks...)
	}
	tests := []struct {
		name  string
		build func(b *streamBuilder)
		want  string
	}{
		{"not a stream", func(b *streamBuilder) { b.WriteString("hello, world") }, "not a QEMU migration stream"},
		{"truncated", func(b *streamBuilder) {
			valid(b)
			b.part(sectionPart)
			b.u64(ramPage)
			b.id(ramID)
			b.WriteString("short")
		}, "unexpected EOF"},
		{"compressed page", func(b *streamBuilder) {
			valid(b)
			b.part(sectionPart)
			b.u64(0x100)
		}, "compression"},
		{"unlisted block", func(b *streamBuilder) {
			valid(b)
			b.part(sectionPart)
			b.page("vga.vram", 0, 1)
		}, `"vga.vram", not in the block list`},
		{"continue first", func(b *streamBuilder) {
			valid(b)
			b.part(sectionPart)
			b.u64(ramPage | ramContinue)
		}, "before any was named"},
		{"no footer", func(b *streamBuilder) {
			valid(b)
			b.part(sectionEnd)
			b.u64(ramEOS)
			b.u8(sectionFull)
			b.u32(9)
		}, "without its footer"},
		{"devices before RAM ends", func(b *streamBuilder) {
			valid(b)
			b.devices()
		}, "before the RAM section ended"},
		{"another iterative section", func(b *streamBuilder) {
			b.header()
			b.u8(sectionStart)
			b.u32(3)
			b.id("block")
			b.u32(0)
			b.u32(1)
		}, `"block"`},
		{"block larger than the RAM", func(b *streamBuilder) {
			b.header()
			b.u8(sectionStart)
			b.u32(2)
			b.id(ramSection)
			b.u32(0)
			b.u32(4)
			b.u64(targetPageSize | ramMemSize)
			b.id(ramID)
			b.u64(2 * targetPageSize)
			b.u64(0)
		}, "does not fit"},
		{"unknown subsection", func(b *streamBuilder) {
			b.u32(streamMagic)
			b.u32(streamVersion)
			b.u8(sectionConfig)
			b.u32(1)
			b.WriteString("m")
			b.u8(sectionSubsection)
			b.id("configuration/new")
			b.u32(1)
		}, `"configuration/new"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b streamBuilder
			tt.build(&b)
			_, err := filterRAM(io.Discard, bytes.NewReader(b.Bytes()), ramID)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// A restore loads only device state that is a regular file, lists the
// guest RAM at the chain's memory size and carries none of its pages.
func TestCheckState(t *testing.T) {
	dir := t.TempDir()
	top := &chain.Link{MemoryBytes: testBlocks[0].Length, StateMemory: chain.StateMemoryFiltered}
	n := 0
	stream := func(build func(b *streamBuilder)) string {
		var b streamBuilder
		b.header()
		build(&b)
		b.devices()
		n++
		path := filepath.Join(dir, "state"+strconv.Itoa(n))
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := stream(func(b *streamBuilder) {
		b.start(testBlocks...)
		b.part(sectionEnd)
		b.page("pc.bios", 0, 7)
		b.eos()
	})
	if err := checkState(good, top); err != nil {
		t.Fatalf("device state without guest RAM: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"fifo", fifo, "not a regular file"},
		{"symlink", link, "open device state"},
		{"guest RAM pages", stream(func(b *streamBuilder) {
			b.start(testBlocks...)
			b.part(sectionEnd)
			b.page(ramID, 0, 9)
			b.eos()
		}), `carries 1 pages of guest RAM (link stateMemory "filtered")`},
		{"other RAM size", stream(func(b *streamBuilder) {
			b.start(ramBlock{ramID, 8 * targetPageSize})
			b.part(sectionEnd)
			b.eos()
		}), "layout changed"},
		{"no guest RAM block", stream(func(b *streamBuilder) {
			b.start(testBlocks[1])
			b.part(sectionEnd)
			b.eos()
		}), "has no " + ramID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkState(tt.path, top); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
