package apifake

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// pagesOf reads a memory file and lists its allocated pages (SEEK_DATA),
// with the file's bytes.
func pagesOf(t *testing.T, path string) ([]int64, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pages []int64
	for off := int64(0); off < int64(len(b)); off += guestPage {
		d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if d == off {
			pages = append(pages, off)
		}
	}
	return pages, b
}

func memoryFile(t *testing.T, dir string, pages int) string {
	t.Helper()
	path := filepath.Join(dir, "memory")
	mem := bytes.Repeat([]byte{0x11}, pages*guestPage)
	if err := os.WriteFile(path, mem, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Firecracker loaded with track_dirty_pages: a Diff writes the pages the
// guest dirtied since the load or the last snapshot, sparse at their
// offsets; a Full writes everything and restarts the log.
func TestFCDiffSnapshots(t *testing.T) {
	dir := t.TempDir()
	mem := memoryFile(t, dir, 4)
	if err := os.WriteFile(filepath.Join(dir, "vmstate"), []byte("vmstate"), 0o600); err != nil {
		t.Fatal(err)
	}
	rounds := [][]GuestWrite{{{Offset: guestPage, Length: guestPage, Fill: 0xa1}}, {{Offset: 3 * guestPage, Length: guestPage, Fill: 0xb2}}}
	_, do := serveModel(t, SpecFC, &FC{Guest: rounds})
	load := `{"snapshot_path":"` + dir + `/vmstate","track_dirty_pages":true,"mem_backend":{"backend_type":"File","backend_path":"` + mem + `"},"vsock_override":{"uds_path":"` + dir + `/v.sock"}}`
	create := func(kind, name string) string {
		return `{"mem_file_path":"` + dir + `/` + name + `","snapshot_path":"` + dir + `/state-` + name + `","snapshot_type":"` + kind + `"}`
	}
	runSteps(t, do, []step{
		{"PUT", "snapshot/load", load, 204},
		{"PATCH", "vm", `{"state":"Resumed"}`, 204},
		{"PATCH", "vm", `{"state":"Paused"}`, 204},
		{"PUT", "snapshot/create", create("Diff", "d1"), 204},
		{"PATCH", "vm", `{"state":"Resumed"}`, 204},
		{"PATCH", "vm", `{"state":"Paused"}`, 204},
		{"PUT", "snapshot/create", create("Diff", "d2"), 204},
		{"PUT", "snapshot/create", create("Full", "full"), 204},
		{"PUT", "snapshot/create", create("Diff", "d3"), 204},
	})
	for _, tt := range []struct {
		name  string
		pages []int64
		fill  byte
	}{{"d1", []int64{guestPage}, 0xa1}, {"d2", []int64{3 * guestPage}, 0xb2}, {"d3", nil, 0}} {
		pages, b := pagesOf(t, filepath.Join(dir, tt.name))
		if len(b) != 4*guestPage || len(pages) != len(tt.pages) || (len(pages) > 0 && (pages[0] != tt.pages[0] || b[pages[0]] != tt.fill)) {
			t.Errorf("%s: %d bytes, pages %v (want %v filled %#x)", tt.name, len(b), pages, tt.pages, tt.fill)
		}
	}
	_, full := pagesOf(t, filepath.Join(dir, "full"))
	if full[0] != 0x11 || full[guestPage] != 0xa1 || full[3*guestPage] != 0xb2 {
		t.Errorf("full snapshot does not hold the guest's writes over its memory")
	}
}

// The Cloud Hypervisor fork's first diff is a full baseline that starts
// dirty tracking; later ones are sparse. Upstream ignores snapshot_type.
func TestCHDiffSnapshots(t *testing.T) {
	for _, tt := range []struct {
		spec   string
		sparse bool
	}{{SpecCHFork, true}, {SpecCH, false}} {
		t.Run(tt.spec, func(t *testing.T) {
			src := t.TempDir()
			memoryFile(t, src, 4)
			if err := os.Rename(filepath.Join(src, "memory"), filepath.Join(src, CHMemoryFile)); err != nil {
				t.Fatal(err)
			}
			for name, data := range map[string]string{CHConfigFile: `{"payload":{}}`, CHStateFile: `{}`} {
				if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			spec, err := LoadSpec(SpecPath(t, tt.spec))
			if err != nil {
				t.Fatal(err)
			}
			rounds := [][]GuestWrite{{{Offset: 0, Length: guestPage, Fill: 0xa1}}, {{Offset: 2 * guestPage, Length: guestPage, Fill: 0xb2}}}
			_, do := serveModel(t, tt.spec, &CH{Spec: spec, Guest: rounds})
			snap := func(dst string) string {
				return `{"destination_url":"file://` + dst + `","snapshot_type":"diff"}`
			}
			base, diff := t.TempDir(), t.TempDir()
			runSteps(t, do, []step{
				{"PUT", "vm.restore", `{"source_url":"file://` + src + `"}`, 204},
				{"PUT", "vm.resume", "", 204},
				{"PUT", "vm.pause", "", 204},
				{"PUT", "vm.snapshot", snap(base), 204},
				{"PUT", "vm.resume", "", 204},
				{"PUT", "vm.pause", "", 204},
				{"PUT", "vm.snapshot", snap(diff), 204},
			})
			pages, b := pagesOf(t, filepath.Join(base, CHMemoryFile))
			if len(pages) != 4 || b[0] != 0xa1 || b[guestPage] != 0x11 {
				t.Errorf("first diff: pages %v, want the full baseline with the first write", pages)
			}
			pages, b = pagesOf(t, filepath.Join(diff, CHMemoryFile))
			if want := 1; tt.sparse && (len(pages) != want || pages[0] != 2*guestPage || b[2*guestPage] != 0xb2) {
				t.Errorf("second diff: pages %v, want only the page dirtied since the first", pages)
			}
			if !tt.sparse && len(pages) != 4 {
				t.Errorf("upstream's second 'diff': pages %v, want a full snapshot", pages)
			}
		})
	}
}

func TestParseGuestWrites(t *testing.T) {
	rounds := [][]GuestWrite{{{Offset: 0, Length: guestPage, Fill: 1}, {Offset: 8 * guestPage, Length: 2 * guestPage, Fill: 255}}, {{Offset: guestPage, Length: guestPage, Fill: 7}}}
	got, err := parseGuestWrites(encodeGuestWrites(rounds))
	if err != nil || len(got) != 2 || got[0][1] != rounds[0][1] || got[1][0] != rounds[1][0] {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	for _, bad := range []string{"1:4096:1", "0:100:1", "0:4096", "0:4096:300"} {
		if _, err := parseGuestWrites(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
