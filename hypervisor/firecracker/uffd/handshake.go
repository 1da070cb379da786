package uffd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// Mapping is one guest memory region as Firecracker describes it in the
// handshake (its GuestRegionUffdMapping): guest memory at host address
// BaseHostVirtAddr, Size bytes long, backed by the memory file from Offset.
type Mapping struct {
	BaseHostVirtAddr uint64 `json:"base_host_virt_addr"`
	Size             uint64 `json:"size"`
	Offset           uint64 `json:"offset"`
	// PageSize is in bytes (current Firecracker); older releases sent
	// PageSizeKiB instead, and the oldest neither, meaning the host page.
	PageSize    uint64 `json:"page_size,omitempty"`
	PageSizeKiB uint64 `json:"page_size_kib,omitempty"`
}

// pageBytes is the region's page size in bytes, 0 when not given.
func (m Mapping) pageBytes() uint64 {
	if m.PageSize != 0 {
		return m.PageSize
	}
	return m.PageSizeKiB * 1024
}

// peer is what the handshake yields: the regions, the userfaultfd
// Firecracker registered them with, and Firecracker's pid.
type peer struct {
	mappings []Mapping
	uffd     int
	pid      int
}

// readHandshake reads Firecracker's one message from conn: the JSON array of
// mappings with the userfaultfd in SCM_RIGHTS. Any descriptor received is
// closed again unless the handshake succeeds.
func readHandshake(conn *net.UnixConn) (peer, error) {
	pid, err := peerPID(conn)
	if err != nil {
		return peer{}, err
	}
	rr := &rightsReader{conn: conn}
	var mappings []Mapping
	if err := json.NewDecoder(rr).Decode(&mappings); err != nil {
		rr.closeAll()
		if errors.Is(err, io.EOF) {
			return peer{}, errors.New("connection closed before the region list arrived")
		}
		return peer{}, fmt.Errorf("decode region list (want a JSON array of GuestRegionUffdMapping): %w", err)
	}
	if n := len(rr.fds); n != 1 {
		rr.closeAll()
		return peer{}, fmt.Errorf("got %d file descriptors, want exactly one userfaultfd in SCM_RIGHTS", n)
	}
	if err := checkUffd(rr.fds[0]); err != nil {
		rr.closeAll()
		return peer{}, err
	}
	return peer{mappings: mappings, uffd: rr.fds[0], pid: pid}, nil
}

func peerPID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return 0, fmt.Errorf("peer credentials: %w", credErr)
	}
	return int(cred.Pid), nil
}

// checkUffd makes sure fd is a userfaultfd and non-blocking: poll(2) on a
// blocking userfaultfd reports only POLLERR.
func checkUffd(fd int) error {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("inspect handshake fd: %w", err)
	}
	if target != "anon_inode:[userfaultfd]" {
		return fmt.Errorf("handshake fd is %s, want a userfaultfd", target)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("set userfaultfd non-blocking: %w", err)
	}
	return nil
}

// rightsReader reads a unix stream, collecting every descriptor that
// arrives in SCM_RIGHTS along the way.
type rightsReader struct {
	conn *net.UnixConn
	fds  []int
}

func (r *rightsReader) Read(p []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := r.conn.ReadMsgUnix(p, oob)
	if n < 0 {
		n = 0 // recvmsg's -1 on error; io.Reader callers slice with n
	}
	if oobn > 0 {
		if perr := r.collect(oob[:oobn]); perr != nil && err == nil {
			err = perr
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.EOF // encoding/json recognises only the bare value
	}
	return n, err
}

func (r *rightsReader) collect(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("parse control message: %w", err)
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue // not SCM_RIGHTS
		}
		r.fds = append(r.fds, fds...)
	}
	return nil
}

func (r *rightsReader) closeAll() {
	for _, fd := range r.fds {
		unix.Close(fd)
	}
	r.fds = nil
}

// validateMappings checks the regions against the memory file and the host:
// page-aligned, inside the file, not overlapping, host-sized pages (hugepage
// guests restore with copy, see DESIGN.md). It returns them sorted by address.
func validateMappings(ms []Mapping, fileSize, hostPage uint64) ([]Mapping, error) {
	if len(ms) == 0 {
		return nil, errors.New("handshake lists no memory regions")
	}
	out := append([]Mapping(nil), ms...)
	for i, m := range out {
		if ps := m.pageBytes(); ps != 0 && ps != hostPage {
			return nil, fmt.Errorf("region %d: page size %d bytes, want %d (hugepage guests restore with copy)", i, ps, hostPage)
		}
		out[i].PageSize, out[i].PageSizeKiB = hostPage, 0
		if m.Size == 0 || m.Size%hostPage != 0 || m.BaseHostVirtAddr%hostPage != 0 || m.Offset%hostPage != 0 {
			return nil, fmt.Errorf("region %d: base %#x size %#x offset %#x must be non-empty and %d-byte aligned",
				i, m.BaseHostVirtAddr, m.Size, m.Offset, hostPage)
		}
		if m.Offset+m.Size < m.Offset || m.Offset+m.Size > fileSize {
			return nil, fmt.Errorf("region %d: file range [%#x, %#x) exceeds the memory file's %d bytes", i, m.Offset, m.Offset+m.Size, fileSize)
		}
		if m.BaseHostVirtAddr+m.Size < m.BaseHostVirtAddr {
			return nil, fmt.Errorf("region %d: address range at %#x wraps around", i, m.BaseHostVirtAddr)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].BaseHostVirtAddr < out[j].BaseHostVirtAddr })
	for i := 1; i < len(out); i++ {
		if prev := out[i-1]; prev.BaseHostVirtAddr+prev.Size > out[i].BaseHostVirtAddr {
			return nil, fmt.Errorf("regions at %#x and %#x overlap", prev.BaseHostVirtAddr, out[i].BaseHostVirtAddr)
		}
	}
	return out, nil
}
