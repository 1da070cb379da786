package task

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// maxHostname is Linux's HOST_NAME_MAX.
const maxHostname = 64

// hostnameOf is the guest's host name: the spec's, else the one in the
// file bind-mounted at /etc/hostname (CRI gives app containers the pod's
// name that way, leaving spec.hostname empty), else the container id.
func hostnameOf(spec *specs.Spec, id string) (string, error) {
	if spec.Hostname != "" {
		return spec.Hostname, nil
	}
	for _, m := range spec.Mounts {
		if filepath.Clean(m.Destination) != "/etc/hostname" || m.Source == "" {
			continue
		}
		name, err := readHostnameFile(m.Source)
		if err != nil {
			return "", fmt.Errorf("hostname from the mount at /etc/hostname: %w", err)
		}
		if name != "" {
			return name, nil
		}
	}
	return id, nil
}

// readHostnameFile reads the first line of a small regular file, without
// following a symlink or blocking on a FIFO.
func readHostnameFile(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	name := strings.TrimSpace(string(line))
	if len(name) > maxHostname {
		return "", fmt.Errorf("host name %q in %s is longer than %d bytes: %w", name, path, maxHostname, errdefs.ErrInvalidArgument)
	}
	return name, nil
}
