package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"
)

// virtioPortsDir lists the guest's virtio-serial ports with their names.
var virtioPortsDir = "/sys/class/virtio-ports"

// ErrPortNotNamed means virtio-serial ports exist but none has the name
// asked for (yet: a port learns its name shortly after the device appears).
var ErrPortNotNamed = errors.New("no virtio-serial port has that name")

// FindSerialPort returns the /dev path of the virtio-serial port called name.
func FindSerialPort(name string) (string, error) {
	entries, err := os.ReadDir(virtioPortsDir)
	if err != nil || len(entries) == 0 {
		return "", fmt.Errorf("no virtio-serial ports in %s: %w", virtioPortsDir, os.ErrNotExist)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(virtioPortsDir, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return filepath.Join("/dev", e.Name()), nil
		}
	}
	return "", fmt.Errorf("port %q in %s: %w", name, virtioPortsDir, ErrPortNotNamed)
}

// serialPort is the guest end of a virtio-serial port, read through Go's
// poller. While no host is connected, read(2) returns 0 at once: serialPort
// reports that as one io.EOF and then parks on the poller until the port
// wakes up again (the host connecting wakes it), so waiting never spins.
type serialPort struct {
	f  *os.File
	rc interface {
		Read(func(fd uintptr) bool) error
	}
	mu  sync.Mutex
	hup bool // io.EOF was reported for the current disconnect
}

// OpenSerialPort opens the port at path for ListenSerial.
func OpenSerialPort(path string) (io.ReadWriteCloser, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open agent port: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open agent port: %w", err)
	}
	return &serialPort{f: f, rc: rc}, nil
}

func (p *serialPort) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int
	var rerr error
	err := p.rc.Read(func(fd uintptr) bool {
		n, rerr = unix.Read(int(fd), b)
		switch {
		case errors.Is(rerr, unix.EAGAIN):
			return false
		case rerr == nil && n == 0 && p.hup:
			return false // still no host: wait for the port's next wake-up
		case rerr == nil && n == 0:
			p.hup = true
			rerr = io.EOF
		case rerr == nil:
			p.hup = false
		}
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("read agent port: %w", err)
	}
	if rerr != nil && !errors.Is(rerr, io.EOF) {
		return 0, fmt.Errorf("read agent port: %w", rerr)
	}
	return n, rerr
}

// Write blocks (on the poller) while no host is connected.
func (p *serialPort) Write(b []byte) (int, error) {
	return p.f.Write(b)
}

func (p *serialPort) Close() error {
	return p.f.Close()
}

// ListenVsock listens on AF_VSOCK port when the guest has a vsock device.
func ListenVsock(port uint32) (net.Listener, error) {
	cid, err := vsock.ContextID()
	if err != nil {
		return nil, fmt.Errorf("vsock context id: %w", err)
	}
	if cid == unix.VMADDR_CID_ANY {
		return nil, fmt.Errorf("no vsock device: %w", os.ErrNotExist)
	}
	l, err := vsock.ListenContextID(cid, port, nil)
	if err != nil {
		return nil, fmt.Errorf("listen on vsock port %d: %w", port, err)
	}
	return l, nil
}
