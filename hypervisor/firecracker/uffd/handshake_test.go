package uffd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd/uffdpeer"
)

func TestMappingPageSize(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		want       uint64
	}{
		{"page_size in bytes", `{"base_host_virt_addr":4096,"size":8192,"offset":0,"page_size":4096}`, 4096},
		{"older page_size_kib", `{"base_host_virt_addr":4096,"size":8192,"offset":0,"page_size_kib":2048}`, 2 << 20},
		{"oldest without either", `{"base_host_virt_addr":4096,"size":8192,"offset":0}`, 0},
	} {
		var m Mapping
		if err := json.Unmarshal([]byte(tc.json), &m); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := m.pageBytes(); got != tc.want {
			t.Errorf("%s: page size %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestValidateMappings(t *testing.T) {
	const page, file = 4096, 16 * 4096
	m := func(base, size, off, ps uint64) Mapping {
		return Mapping{BaseHostVirtAddr: base, Size: size, Offset: off, PageSize: ps}
	}
	for _, tc := range []struct {
		name    string
		in      []Mapping
		wantErr string
	}{
		{"one region", []Mapping{m(0x10000, file, 0, page)}, ""},
		{"page size absent", []Mapping{m(0x10000, page, 0, 0)}, ""},
		{"two regions unsorted", []Mapping{m(0x40000, page, page, page), m(0x10000, page, 0, page)}, ""},
		{"none", nil, "no memory regions"},
		{"hugepages", []Mapping{{BaseHostVirtAddr: 0x200000, Size: 0x200000, PageSizeKiB: 2048}}, "hugepage guests restore with copy"},
		{"empty region", []Mapping{m(0x10000, 0, 0, page)}, "must be non-empty"},
		{"unaligned base", []Mapping{m(0x10001, page, 0, page)}, "aligned"},
		{"unaligned offset", []Mapping{m(0x10000, page, 100, page)}, "aligned"},
		{"past end of file", []Mapping{m(0x10000, 2*page, file-page, page)}, "exceeds the memory file"},
		{"offset overflow", []Mapping{m(0x10000, page, ^uint64(0)&^(page-1), page)}, "exceeds the memory file"},
		{"address wraps", []Mapping{m(^uint64(0)&^(page-1), 2*page, 0, page)}, "wraps around"},
		{"overlap", []Mapping{m(0x10000, 2*page, 0, page), m(0x11000, page, 0, page)}, "overlap"},
	} {
		got, err := validateMappings(tc.in, file, page)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			for i := 1; i < len(got); i++ {
				if got[i-1].BaseHostVirtAddr > got[i].BaseHostVirtAddr {
					t.Errorf("%s: regions not sorted: %+v", tc.name, got)
				}
			}
			for _, r := range got {
				if r.PageSize != page {
					t.Errorf("%s: page size %d after validation, want %d", tc.name, r.PageSize, page)
				}
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want it to mention %q", tc.name, err, tc.wantErr)
		}
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func pipe(t *testing.T) int {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0]
}

// waitErr waits for h to end and returns its error.
func waitErr(t *testing.T, h *Handler) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("handler did not end within %v", hangGuard)
		return nil
	}
}

// A handshake Firecracker would never send ends the handler with an error
// naming the problem, and leaves no descriptor or socket behind.
func TestBadHandshake(t *testing.T) {
	dir := t.TempDir()
	path, _ := memoryFile(t, dir, 4, nil)
	// Let the runtime set up its network poller before counting descriptors.
	warm, _ := startHandler(t, dir, path)
	warm.Close()

	regions := []byte(`[{"base_host_virt_addr":65536,"size":4096,"offset":0,"page_size":4096}]`)
	for _, tc := range []struct {
		name    string
		payload []byte // nil: connect and hang up without sending
		fds     int    // pipe descriptors sent along
		wantErr string
	}{
		{"garbage JSON", []byte("hello firecracker"), 1, "decode region list"},
		{"truncated JSON", regions[:20], 1, "decode region list"},
		{"no descriptor", regions, 0, "got 0 file descriptors"},
		{"two descriptors", regions, 2, "got 2 file descriptors"},
		{"not a userfaultfd", regions, 1, "want a userfaultfd"},
		{"hang up before sending", nil, 0, "connection closed before the region list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fds []int
			for range tc.fds {
				fds = append(fds, pipe(t))
			}
			before := openFDs(t)
			sock := filepath.Join(t.TempDir(), "uffd.sock")
			h, err := Listen(t.Context(), sock, path)
			if err != nil {
				t.Fatal(err)
			}
			if err := uffdpeer.Handshake(sock, tc.payload, fds...); err != nil {
				t.Fatal(err)
			}
			err = waitErr(t, h)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Wait: %v, want an error mentioning %q", err, tc.wantErr)
			}
			if err := h.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if got := openFDs(t); got != before {
				t.Errorf("%d descriptors open after Close, want %d", got, before)
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("socket still there after Close: %v", err)
			}
		})
	}
}
