package qemu

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

// sparseMemory writes a size-byte sparse file whose every other 2 MiB
// block is random data, and returns its path and bytes.
func sparseMemory(t testing.TB, size int64) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "memory")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{1})
	const block = 2 << 20
	for off := int64(0); off < size; off += 2 * block {
		n := min(block, size-off)
		rng.Read(want[off : off+n])
		if _, err := f.WriteAt(want[off:off+n], off); err != nil {
			t.Fatal(err)
		}
	}
	return path, want
}

func TestFillMemfd(t *testing.T) {
	const size = 16 << 20
	path, want := sparseMemory(t, size)
	f, src, err := fillMemfd(path, size)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer src.Close()
	if src.Name() != path {
		t.Errorf("fillMemfd handed back %s, want the source %s", src.Name(), path)
	}
	got, err := io.ReadAll(io.NewSectionReader(f, 0, size))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("memfd differs from the memory file")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if allocated := st.Blocks * 512; allocated > size/2+(1<<20) {
		t.Errorf("memfd allocated %d bytes for %d bytes of data: holes were copied", allocated, size/2)
	}
}

func TestFillMemfdSizeMismatch(t *testing.T) {
	path, _ := sparseMemory(t, 4<<20)
	if _, _, err := fillMemfd(path, 8<<20); err == nil || !strings.Contains(err.Error(), "8388608") {
		t.Fatalf("err %v, want a size mismatch naming the expected size", err)
	}
}

// BenchmarkFillMemfd compares the chosen fill (sendfile) with reading into
// a mapping of the memfd and with pwrite through a bounce buffer.
func BenchmarkFillMemfd(b *testing.B) {
	const size = 512 << 20
	path, _ := sparseMemory(b, size)
	fills := []struct {
		name string
		fill func(dst, src *os.File, size int64) error
	}{
		{"sendfile", copyExtents},
		{"mmap-read", mmapFill},
		{"pwrite", pwriteFill},
	}
	for _, f := range fills {
		b.Run(f.name, func(b *testing.B) {
			b.SetBytes(size / 2)
			for b.Loop() {
				benchFill(b, path, size, f.fill)
			}
		})
	}
}

func benchFill(b *testing.B, path string, size int64, fill func(dst, src *os.File, size int64) error) {
	src, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("bench", unix.MFD_CLOEXEC)
	if err != nil {
		b.Fatal(err)
	}
	dst := os.NewFile(uintptr(fd), "bench")
	defer dst.Close()
	if err := fill(dst, src, size); err != nil {
		b.Fatal(err)
	}
}

// eachExtent calls fn for every data extent of src.
func eachExtent(src *os.File, fn func(data, hole int64) error) error {
	for e, err := range chain.DataRegions(src) {
		if err != nil {
			return err
		}
		if err := fn(e.Offset, e.End()); err != nil {
			return err
		}
	}
	return nil
}

func mmapFill(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	mem, err := unix.Mmap(int(dst.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	return eachExtent(src, func(data, hole int64) error {
		_, err := src.ReadAt(mem[data:hole], data)
		return err
	})
}

func pwriteFill(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	return eachExtent(src, func(data, hole int64) error {
		for p := data; p < hole; {
			n, err := src.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			if err != nil {
				return err
			}
			if _, err := dst.WriteAt(buf[:n], p); err != nil {
				return err
			}
			p += int64(n)
		}
		return nil
	})
}
