package container

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// sealedCopy is a sealed in-memory copy of the binary at path, which the
// agent execs instead of the file (as runc runs a sealed copy of
// itself): a container process that reaches the container init's
// /proc/PID/exe cannot write the guest's binary through it, which every
// container's init would run next.
func sealedCopy(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open the container init: %w", err)
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("cocoon-cinit", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("copy the container init: %w", err)
	}
	f := os.NewFile(uintptr(fd), "cocoon-cinit")
	if _, err = io.Copy(f, src); err == nil {
		_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("copy the container init: %w", err)
	}
	return f, nil
}

// execPath is how a child execs f: through this process's descriptor,
// which the child holds until its exec.
func execPath(f *os.File) string {
	return fmt.Sprintf("/proc/self/fd/%d", f.Fd())
}
