package chain

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestNormalizeExtents(t *testing.T) {
	const size = 16 * testPage
	got, err := normalizeExtents([]Extent{
		{8 * testPage, testPage}, {0, 2 * testPage}, {testPage, 2 * testPage}, {3 * testPage, testPage},
	}, size, testPage)
	if err != nil {
		t.Fatal(err)
	}
	want := []Extent{{0, 4 * testPage}, {8 * testPage, testPage}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []Extent{{1, testPage}, {0, 0}, {0, 100}, {size, testPage}, {-testPage, testPage}} {
		if _, err := normalizeExtents([]Extent{bad}, size, testPage); err == nil {
			t.Errorf("extent %v accepted", bad)
		}
	}
}

func TestWritersRejectBadInput(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	c := buildChain(t, root, 16)
	small := filepath.Join(root, "small")
	writeSparse(t, small, make([]byte, 8*testPage))
	odd := filepath.Join(root, "odd")
	if err := os.WriteFile(odd, make([]byte, testPage+1), 0o644); err != nil {
		t.Fatal(err)
	}
	mem0 := filepath.Join(root, "mem0")
	tests := []struct {
		name  string
		write func(out string) error
		want  string
	}{
		{"memory not whole pages", func(out string) error {
			_, err := WriteFull(ctx, odd, testMeta(), out)
			return err
		}, "whole 4096-byte pages"},
		{"missing state file", func(out string) error {
			_, err := WriteFull(ctx, mem0, testMeta("qemu.state"), out)
			return err
		}, "qemu.state"},
		{"no hypervisor", func(out string) error {
			_, err := WriteFull(ctx, mem0, Meta{GuestOS: "linux", VCPUs: 1}, out)
			return err
		}, "hypervisor is empty"},
		{"link exists", func(out string) error {
			_, err := WriteFull(ctx, mem0, testMeta(), c.dirs[0])
			return err
		}, "already holds a link"},
		{"diff memory size changes", func(out string) error {
			_, err := WriteDiff(ctx, small, mem0, c.dirs[0], testMeta(), out)
			return err
		}, "memory size changes"},
		{"diff parent memory size", func(out string) error {
			_, err := WriteDiff(ctx, mem0, small, c.dirs[0], testMeta(), out)
			return err
		}, "parent link says"},
		{"dirty page out of bounds", func(out string) error {
			_, err := WriteDiffPages(ctx, mem0, []Extent{{16 * testPage, testPage}}, c.dirs[0], testMeta(), out)
			return err
		}, "out of bounds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			err := tt.write(out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
			assertEmptyDir(t, out)
		})
	}
}

func TestWriteDiffOfIdenticalMemoryIsEmpty(t *testing.T) {
	root := t.TempDir()
	c := buildChain(t, root, 16)
	mem0 := filepath.Join(root, "mem0")
	l, err := WriteDiff(context.Background(), mem0, mem0, c.dirs[0], testMeta(), filepath.Join(root, "same"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Memory.Extents != 0 || l.Memory.DataBytes != 0 {
		t.Fatalf("diff of identical memory has %d extents, %d bytes", l.Memory.Extents, l.Memory.DataBytes)
	}
	if _, err := Validate(filepath.Join(root, "same"), mustRead(t, c.dirs[0])); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, dir string) *Link {
	t.Helper()
	l, err := ReadLink(dir)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestHugePageLinks(t *testing.T) {
	const huge = 2 << 20
	ctx := context.Background()
	root := t.TempDir()
	mem := make([]byte, 4*huge)
	mem[huge+12345] = 1 // one byte makes the whole huge page non-zero
	memPath := filepath.Join(root, "mem")
	writeSparse(t, memPath, mem)
	meta := Meta{Hypervisor: "qemu", GuestOS: "linux", VCPUs: 1, PageSize: huge, HugePages: true}
	full := filepath.Join(root, "full")
	l, err := WriteFull(ctx, memPath, meta, full)
	if err != nil {
		t.Fatal(err)
	}
	if l.Memory.Extents != 1 || l.Memory.DataBytes != huge {
		t.Fatalf("full link: %d extents, %d bytes; want one huge page", l.Memory.Extents, l.Memory.DataBytes)
	}
	mem[huge+12345] = 0
	mem[3*huge] = 2
	writeSparse(t, memPath, mem)
	flat := filepath.Join(root, "flat0")
	if err := Flatten(ctx, []string{full}, flat); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(root, "diff")
	if l, err = WriteDiff(ctx, memPath, flat, full, meta, diff); err != nil {
		t.Fatal(err)
	}
	if l.Memory.Extents != 2 || l.Memory.DataBytes != 2*huge {
		t.Fatalf("diff link: %d extents, %d bytes; want two huge pages", l.Memory.Extents, l.Memory.DataBytes)
	}
	out := filepath.Join(root, "flat1")
	if err := Flatten(ctx, []string{full, diff}, out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mem) {
		t.Fatal("huge-page chain flattens to different memory")
	}
	checkSparse(t, out, mem)
}
