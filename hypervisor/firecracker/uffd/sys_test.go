package uffd

import (
	"encoding/binary"
	"testing"
)

// The request numbers linux/userfaultfd.h yields on 64-bit Linux.
func TestIoctlNumbers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"UFFDIO_WAKE", ioctlWake, 0x8010aa02},
		{"UFFDIO_COPY", ioctlCopy, 0xc028aa03},
		{"UFFDIO_ZEROPAGE", ioctlZeropage, 0xc020aa04},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %#x, want %#x", tc.name, tc.got, tc.want)
		}
	}
}

func TestDecodeMessage(t *testing.T) {
	raw := func(event byte, words ...uint64) []byte {
		b := make([]byte, msgSize)
		b[0] = event
		for i, w := range words {
			binary.NativeEndian.PutUint64(b[8+8*i:], w)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want message
	}{
		{"pagefault", raw(eventPagefault, 1, 0x7f0000001234), message{Event: eventPagefault, A: 0x7f0000001234}},
		{"remove", raw(eventRemove, 0x7f0000000000, 0x7f0000040000), message{Event: eventRemove, A: 0x7f0000000000, B: 0x7f0000040000}},
		{"fork", raw(eventFork, 0xffffffff00000007), message{Event: eventFork, A: 7}},
		{"unknown", raw(0x16, 1, 2, 3), message{Event: 0x16}},
	} {
		if got := decodeMessage(tc.in); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
