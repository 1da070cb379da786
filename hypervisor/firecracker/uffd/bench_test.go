package uffd

import (
	"runtime"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// BenchmarkFault measures end-to-end fault latency: each iteration reads
// one untouched page of guest memory from another thread, which blocks until
// the handler has resolved it. "copy" pages come from the memory file's data,
// "zero" pages from a hole.
func BenchmarkFault(b *testing.B) {
	testenv.RequireRoot(b)
	const pages = 4096
	for _, bc := range []struct {
		name  string
		holes [][2]int
	}{
		{"copy", nil},
		{"zero", [][2]int{{0, pages}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dir := b.TempDir()
			path, _ := memoryFile(b, dir, pages, bc.holes)
			h, sock := startHandler(b, dir, path)
			// No UFFD_FEATURE_EVENT_REMOVE: MADV_DONTNEED then re-arms the
			// pages silently and they fault from the file again.
			p := startPeer(b, pages*pageSize, 0)
			if err := p.Send(sock, p.Mapping(0, uint64(pages*pageSize), 0)); err != nil {
				b.Fatal(err)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			buf := make([]byte, 8)
			b.ResetTimer()
			for i := range b.N {
				g := i % pages
				if g == 0 && i > 0 {
					b.StopTimer()
					if err := p.Remove(0, pages*pageSize); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				if err := p.Read(g*pageSize, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			h.Close()
			if got := h.Stats().Faults; got != uint64(b.N) {
				b.Fatalf("handler resolved %d faults, want %d", got, b.N)
			}
			perFault := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(perFault*1e6, "µs/fault")
			b.ReportMetric(1/perFault, "faults/s")
		})
	}
}
