package uffdpeer

import (
	"bytes"
	"os"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

var pageSize = os.Getpagesize()

// The request numbers linux/userfaultfd.h yields on 64-bit Linux for
// UFFDIO_API, UFFDIO_REGISTER and USERFAULTFD_IOC_NEW.
func TestIoctlNumbers(t *testing.T) {
	got := [...]uintptr{ioctlAPI, ioctlRegister, ioctlDevNewFD}
	if want := [...]uintptr{0xc018aa3f, 0xc020aa00, 0xaa00}; got != want {
		t.Errorf("ioctl numbers %#x, want %#x", got, want)
	}
}

// With its userfaultfd closed the peer's memory is plain anonymous memory:
// writes read back and a removed range reads as zeros, with no handler.
func TestReadWriteRemoveWithoutHandler(t *testing.T) {
	testenv.RequireRoot(t)
	p, err := New(4*pageSize, FeatureEventRemove)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.CloseUFFD()
	data := bytes.Repeat([]byte("cocoon"), pageSize)[:2*pageSize]
	if err := p.Write(pageSize, data); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := p.Read(pageSize, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Error("read back differs from what was written")
	}
	if err := p.Remove(pageSize, pageSize); err != nil {
		t.Fatal(err)
	}
	if err := p.Read(pageSize, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:pageSize], make([]byte, pageSize)) || !bytes.Equal(got[pageSize:], data[pageSize:]) {
		t.Error("Remove did not zero exactly the removed page")
	}
	ps := uint64(pageSize)
	want := Mapping{BaseHostVirtAddr: p.base() + ps, Size: 2 * ps, Offset: 8 * ps, PageSize: ps}
	if m := p.Mapping(ps, 2*ps, 8*ps); m != want {
		t.Errorf("Mapping = %+v, want %+v", m, want)
	}
}
