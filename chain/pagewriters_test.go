package chain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A full link read through a ReaderAt over the regions that may hold data
// is the link WriteFull makes of the same memory, and a diff on a staged
// parent (ID from chain.json) flattens to the new memory, zeroed pages too.
func TestWriteFromReaderAt(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	const pages = 64
	mem0 := randomMemory(7, pages)
	mem0Path := filepath.Join(root, "mem0")
	writeSparse(t, mem0Path, mem0)

	byFile := filepath.Join(root, "byfile")
	writeState(t, byFile, "qemu.state")
	want, err := WriteFull(ctx, mem0Path, testMeta("qemu.state"), byFile)
	if err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(root, "full")
	writeState(t, full, "qemu.state")
	// Overlapping, unsorted regions covering everything.
	regions := []Extent{{32 * testPage, 32 * testPage}, {0, 40 * testPage}}
	got, err := WriteFullFrom(ctx, bytes.NewReader(mem0), int64(len(mem0)), regions, testMeta("qemu.state"), full, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID() != want.ID() {
		t.Fatalf("WriteFullFrom link %s, WriteFull %s: want the same link", got.ID(), want.ID())
	}

	if err := WriteStaged(root, []*Link{got}); err != nil {
		t.Fatal(err)
	}
	staged, err := OpenStaged(root)
	if err != nil {
		t.Fatal(err)
	}
	mem1 := bytes.Clone(mem0)
	var dirty []Extent
	for p := 1; p < pages; p += 5 {
		if p%2 == 0 {
			clear(mem1[p*testPage : (p+1)*testPage])
		} else {
			mem1[p*testPage+9] ^= 0x33
		}
		dirty = append(dirty, Extent{int64(p) * testPage, testPage})
	}
	diff := filepath.Join(root, "diff")
	writeState(t, diff, "qemu.state")
	meta := testMeta("qemu.state")
	meta.StateMemory = StateMemoryFiltered
	var hooked int
	written := func() error {
		hooked++
		if _, err := os.Stat(filepath.Join(diff, LinkFile)); err == nil {
			t.Error("link.json exists when the pages are just written")
		}
		if fi, err := os.Stat(filepath.Join(diff, DataFile)); err != nil || fi.Size() != int64(len(dirty))*testPage {
			t.Errorf("memory.data when the pages are written: %v, %v", fi, err)
		}
		return nil
	}
	l, err := WriteDiffOn(ctx, bytes.NewReader(mem1), dirty, staged.Top(), meta, diff, written)
	if err != nil {
		t.Fatal(err)
	}
	if hooked != 1 {
		t.Errorf("written ran %d times, want once", hooked)
	}
	if l.Memory.DataBytes != int64(len(dirty))*testPage || l.StateMemory != StateMemoryFiltered {
		t.Fatalf("diff carries %d bytes (state memory %q), want %d (%q)", l.Memory.DataBytes, l.StateMemory, len(dirty)*testPage, StateMemoryFiltered)
	}
	flat := filepath.Join(root, "flat")
	if err := Flatten(ctx, []string{full, diff}, flat); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(flat); err != nil || !bytes.Equal(b, mem1) {
		t.Fatalf("flatten of full + diff differs from the memory (%v)", err)
	}
}

func TestWriteFromReaderAtRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := make([]byte, 8*testPage)
	parent := &Link{Version: Version, Kind: KindFull, Hypervisor: "qemu", GuestOS: "linux", VCPUs: 1, MemoryBytes: int64(len(mem)), PageSize: testPage}
	tests := []struct {
		name  string
		write func(out string) error
		want  string
	}{
		{"region out of bounds", func(out string) error {
			_, err := WriteFullFrom(ctx, bytes.NewReader(mem), int64(len(mem)), []Extent{{0, 9 * testPage}}, testMeta(), out, nil)
			return err
		}, "out of bounds"},
		{"region not whole pages", func(out string) error {
			_, err := WriteFullFrom(ctx, bytes.NewReader(mem), int64(len(mem)), []Extent{{1, testPage}}, testMeta(), out, nil)
			return err
		}, "whole 4096-byte pages"},
		{"parent without ID", func(out string) error {
			_, err := WriteDiffOn(ctx, bytes.NewReader(mem), []Extent{{0, testPage}}, parent, testMeta(), out, nil)
			return err
		}, "no ID"},
		{"memory shorter than the link", func(out string) error {
			_, err := WriteFullFrom(ctx, bytes.NewReader(mem[:testPage]), int64(len(mem)), []Extent{{0, 2 * testPage}}, testMeta(), out, nil)
			return err
		}, "read memory"},
		{"written fails", func(out string) error {
			_, err := WriteFullFrom(ctx, bytes.NewReader(mem), int64(len(mem)), []Extent{{0, testPage}}, testMeta(), out,
				func() error { return errors.New("resume failed") })
			return err
		}, "resume failed"},
		{"unknown state memory", func(out string) error {
			m := testMeta()
			m.StateMemory = "maybe"
			_, err := WriteFullFrom(ctx, bytes.NewReader(mem), int64(len(mem)), nil, m, out, nil)
			return err
		}, `state memory "maybe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(root, strings.ReplaceAll(tt.name, " ", "-"))
			err := tt.write(out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(out, LinkFile)); err == nil {
				t.Fatal("a link was written")
			}
			for _, f := range []string{ExtentsFile, DataFile} {
				if _, err := os.Stat(filepath.Join(out, f)); err == nil {
					t.Errorf("%s left behind", f)
				}
			}
		})
	}
}

func TestParseLinkStateMemory(t *testing.T) {
	for _, tt := range []struct {
		value string
		ok    bool
	}{{"", true}, {StateMemoryFiltered, true}, {"maybe", false}} {
		l := Link{Version: Version, Kind: KindFull, Hypervisor: "qemu", GuestOS: "linux", VCPUs: 1,
			MemoryBytes: testPage, PageSize: testPage, StateMemory: tt.value,
			Memory: MemoryInfo{ExtentsDigest: emptyDigest, DataDigest: emptyDigest}}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseLink(b)
		if (err == nil) != tt.ok {
			t.Fatalf("stateMemory %q: %v, want ok=%v", tt.value, err, tt.ok)
		}
		if err == nil && got.StateMemory != tt.value {
			t.Fatalf("stateMemory %q read back as %q", tt.value, got.StateMemory)
		}
	}
}

const emptyDigest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
