package chain

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

const benchMemory = 256 << 20

var bench struct {
	once sync.Once
	root string
	dirs []string
	mem  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bench.root != "" {
		os.RemoveAll(bench.root)
	}
	os.Exit(code)
}

// benchChain builds, once per run, a 256 MiB memory with about half its
// pages non-zero and a full link plus two diffs of about 10% of it each.
func benchChain(b *testing.B) ([]string, string) {
	bench.once.Do(func() {
		bench.root, bench.err = os.MkdirTemp("", "chain-bench-")
		if bench.err == nil {
			bench.err = buildBenchChain()
		}
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return bench.dirs, bench.mem
}

func buildBenchChain() error {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 7))
	bench.mem = filepath.Join(bench.root, "memory")
	f, err := os.Create(bench.mem)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(benchMemory); err != nil {
		return err
	}
	page := make([]byte, testPage)
	for off := int64(0); off < benchMemory; off += testPage {
		if r.IntN(2) == 0 {
			continue
		}
		fillPage(r, page)
		if _, err := f.WriteAt(page, off); err != nil {
			return err
		}
	}
	dir := filepath.Join(bench.root, "link0")
	if _, err := WriteFull(ctx, bench.mem, testMeta(), dir); err != nil {
		return err
	}
	bench.dirs = append(bench.dirs, dir)
	for i := 1; i <= 2; i++ {
		var dirty []Extent
		for off := int64(0); off < benchMemory; off += testPage {
			if r.IntN(10) != 0 {
				continue
			}
			clear(page)
			if r.IntN(4) != 0 {
				fillPage(r, page)
			}
			if _, err := f.WriteAt(page, off); err != nil {
				return err
			}
			dirty = append(dirty, Extent{off, testPage})
		}
		dir := filepath.Join(bench.root, "link"+string(rune('0'+i)))
		if _, err := WriteDiffPages(ctx, bench.mem, dirty, bench.dirs[i-1], testMeta(), dir); err != nil {
			return err
		}
		bench.dirs = append(bench.dirs, dir)
	}
	return nil
}

func fillPage(r *rand.Rand, page []byte) {
	for i := 0; i < len(page); i += 8 {
		v := r.Uint64() | 1
		for j := range 8 {
			page[i+j] = byte(v >> (8 * j))
		}
	}
}

func BenchmarkFlatten(b *testing.B) {
	dirs, _ := benchChain(b)
	out := filepath.Join(b.TempDir(), "memory")
	b.SetBytes(benchMemory)
	b.ResetTimer()
	for range b.N {
		if err := Flatten(context.Background(), dirs, out); err != nil {
			b.Fatal(err)
		}
		removeUntimed(b, out)
	}
}

// removeUntimed removes a benchmark's output outside the timer: freeing a
// fragmented file (with online discard) is eviction's cost, not the writer's.
func removeUntimed(b *testing.B, path string) {
	b.StopTimer()
	if err := os.Remove(path); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
}

// BenchmarkSequentialCopy copies the same memory file the chain describes,
// as a baseline for BenchmarkFlatten.
func BenchmarkSequentialCopy(b *testing.B) {
	_, mem := benchChain(b)
	b.Run("read-write", func(b *testing.B) {
		benchCopy(b, mem, func(dst, src *os.File) error {
			_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, ioChunk))
			return err
		})
	})
	b.Run("copy_file_range", func(b *testing.B) {
		benchCopy(b, mem, func(dst, src *os.File) error {
			_, err := io.Copy(dst, src)
			return err
		})
	})
}

func benchCopy(b *testing.B, mem string, cp func(dst, src *os.File) error) {
	out := filepath.Join(b.TempDir(), "copy")
	b.SetBytes(benchMemory)
	b.ResetTimer()
	for range b.N {
		src, err := os.Open(mem)
		if err != nil {
			b.Fatal(err)
		}
		dst, err := os.Create(out)
		if err != nil {
			b.Fatal(err)
		}
		if err := cp(dst, src); err != nil {
			b.Fatal(err)
		}
		if err := dst.Sync(); err != nil {
			b.Fatal(err)
		}
		dst.Close()
		src.Close()
		removeUntimed(b, out)
	}
}

func BenchmarkWriteFull(b *testing.B) {
	_, mem := benchChain(b)
	b.SetBytes(benchMemory)
	b.ResetTimer()
	for range b.N {
		out := filepath.Join(b.TempDir(), "link")
		if _, err := WriteFull(context.Background(), mem, testMeta(), out); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(out)
		b.StartTimer()
	}
}

// BenchmarkWriteDiff diffs the memory against its chain's first two links.
func BenchmarkWriteDiff(b *testing.B) {
	dirs, mem := benchChain(b)
	parentMem := filepath.Join(b.TempDir(), "parent")
	if err := Flatten(context.Background(), dirs[:2], parentMem); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchMemory)
	b.ResetTimer()
	for range b.N {
		out := filepath.Join(b.TempDir(), "link")
		if _, err := WriteDiff(context.Background(), mem, parentMem, dirs[1], testMeta(), out); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(out)
		b.StartTimer()
	}
}

// BenchmarkVerifyData hashes a link with 100 MiB of memory data: warm is
// the case at Commit, right after the unpack wrote the bytes; cold reads
// them from disk first.
func BenchmarkVerifyData(b *testing.B) {
	const size = 100 << 20
	r := rand.New(rand.NewPCG(9, 9))
	mem := filepath.Join(b.TempDir(), "memory")
	f, err := os.Create(mem)
	if err != nil {
		b.Fatal(err)
	}
	page := make([]byte, testPage)
	for off := int64(0); off < size; off += testPage {
		fillPage(r, page)
		if _, err := f.WriteAt(page, off); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	dir := filepath.Join(b.TempDir(), "link")
	l, err := WriteFull(context.Background(), mem, testMeta(), dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, cold := range []bool{false, true} {
		name := map[bool]string{false: "warm", true: "cold"}[cold]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if cold {
					b.StopTimer()
					dropCache(b, filepath.Join(dir, DataFile))
					b.StartTimer()
				}
				if err := VerifyData(context.Background(), dir, l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// dropCache evicts path's clean pages from the page cache.
func dropCache(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
}
