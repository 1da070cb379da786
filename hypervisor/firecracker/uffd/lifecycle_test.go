package uffd

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/firecracker/uffd/uffdpeer"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// Environment of the child process that plays a Firecracker which exits.
const (
	envPeerSock  = "COCOON_UFFD_TEST_PEER_SOCK"
	envPeerMem   = "COCOON_UFFD_TEST_PEER_MEM"
	envPeerPages = "COCOON_UFFD_TEST_PEER_PAGES"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(envPeerSock); sock != "" {
		if err := runPeer(sock, os.Getenv(envPeerMem), os.Getenv(envPeerPages)); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runPeer is the child: it hands its guest memory to the handler, reads
// every page, checks it against the file and exits.
func runPeer(sock, memPath, pagesArg string) error {
	pages, err := strconv.Atoi(pagesArg)
	if err != nil {
		return fmt.Errorf("page count %q: %w", pagesArg, err)
	}
	want, err := os.ReadFile(memPath)
	if err != nil {
		return err
	}
	size := uint64(pages * pageSize)
	p, err := uffdpeer.New(int(size), uffdpeer.FeatureEventRemove)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Send(sock, p.Mapping(0, size, 0)); err != nil {
		return err
	}
	all := make([]int, pages)
	for i := range all {
		all[i] = i
	}
	return checkPages(p, all, func(g int) int { return g }, want)
}

// When the Firecracker process exits, the handler notices through its pidfd
// and ends without error: the kernel sends no event for it on the uffd.
func TestHandlerEndsWhenFirecrackerExits(t *testing.T) {
	testenv.RequireRoot(t)
	const pages = 64
	dir := t.TempDir()
	path, _ := memoryFile(t, dir, pages, [][2]int{{8, 16}})
	h, sock := startHandler(t, dir, path)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPeerSock+"="+sock, envPeerMem+"="+path, envPeerPages+"="+strconv.Itoa(pages))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("firecracker stand-in failed: %v\n%s", err, out)
	}
	if err := waitErr(t, h); err != nil {
		t.Fatalf("Wait after firecracker exited: %v", err)
	}
	if got, want := h.Stats(), (Stats{Faults: pages, Copied: pages - 8, Zeroed: 8}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// Every way of stopping the handler before or during the handshake ends it
// without error and removes the socket.
func TestHandlerStops(t *testing.T) {
	dir := t.TempDir()
	path, _ := memoryFile(t, dir, 4, nil)
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, h *Handler, cancel context.CancelFunc, sock string)
	}{
		{"close before firecracker connects", func(t *testing.T, h *Handler, _ context.CancelFunc, _ string) {
			h.Close()
		}},
		{"cancel before firecracker connects", func(t *testing.T, _ *Handler, cancel context.CancelFunc, _ string) {
			cancel()
		}},
		{"close while firecracker is silent", func(t *testing.T, h *Handler, _ context.CancelFunc, sock string) {
			conn, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte(`[{"base_host`)); err != nil {
				t.Fatal(err)
			}
			h.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			sock := filepath.Join(t.TempDir(), "uffd.sock")
			h, err := Listen(ctx, sock, path)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			tc.stop(t, h, cancel, sock)
			if err := waitErr(t, h); err != nil {
				t.Errorf("Wait: %v", err)
			}
			if err := h.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("socket still there: %v", err)
			}
		})
	}
}

// A real userfaultfd with regions the memory file cannot back is refused,
// and the handler's copy of the userfaultfd is closed.
func TestHandlerRefusesRegionsPastFile(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	path, _ := memoryFile(t, dir, 4, nil)
	warm, _ := startHandler(t, dir, path)
	warm.Close()
	p := startPeer(t, 8*pageSize, uffdpeer.FeatureEventRemove)
	before := openFDs(t)
	sock := filepath.Join(t.TempDir(), "uffd.sock")
	h, err := Listen(t.Context(), sock, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Send(sock, p.Mapping(0, uint64(8*pageSize), 0)); err != nil {
		t.Fatal(err)
	}
	err = waitErr(t, h)
	if err == nil || !strings.Contains(err.Error(), "exceeds the memory file") {
		t.Errorf("Wait: %v, want an error about the memory file's size", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got := openFDs(t); got != before {
		t.Errorf("%d descriptors open after Close, want %d", got, before)
	}
}

// Listen reports a missing or empty memory file and a taken socket path.
func TestListenErrors(t *testing.T) {
	dir := t.TempDir()
	path, _ := memoryFile(t, dir, 1, nil)
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	taken := filepath.Join(dir, "taken")
	if err := os.WriteFile(taken, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, sock, mem, wantErr string
	}{
		{"missing memory file", filepath.Join(dir, "a.sock"), filepath.Join(dir, "nope"), "open memory file"},
		{"empty memory file", filepath.Join(dir, "b.sock"), empty, "is empty"},
		{"socket path taken", taken, path, "listen on uffd socket"},
	} {
		h, err := Listen(t.Context(), tc.sock, tc.mem)
		if err == nil {
			h.Close()
			t.Errorf("%s: Listen succeeded", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v, want it to mention %q", tc.name, err, tc.wantErr)
		}
	}
	if _, err := os.Stat(taken); err != nil {
		t.Errorf("the file at a taken socket path is gone: %v", err)
	}
}
