package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
)

// sysctlKey is a sysctl's name as OCI's linux.sysctl has it: components of
// /proc/sys joined by dots (or slashes), none of them empty, "." or "..".
var sysctlKey = regexp.MustCompile(`^[A-Za-z0-9_-]+([./][A-Za-z0-9_-]+)*$`)

// sysctl is one checked setting.
type sysctl struct{ key, value string }

// checkSysctls checks the sysctls of an Init, and returns them in the
// order of their names, so a guest sets them the same way every time.
func checkSysctls(in map[string]string) ([]sysctl, error) {
	if len(in) > api.MaxSysctls {
		return nil, fmt.Errorf("%d sysctls, expected at most %d: %w", len(in), api.MaxSysctls, errdefs.ErrInvalidArgument)
	}
	out := make([]sysctl, 0, len(in))
	for k, v := range in {
		if len(k) > api.MaxSysctlKey || !sysctlKey.MatchString(k) {
			return nil, fmt.Errorf("sysctl %q: expected a name like net.ipv4.ip_forward, at most %d bytes: %w", k, api.MaxSysctlKey, errdefs.ErrInvalidArgument)
		}
		if len(v) > api.MaxSysctlValue {
			return nil, fmt.Errorf("sysctl %s: value of %d bytes, expected at most %d: %w", k, len(v), api.MaxSysctlValue, errdefs.ErrInvalidArgument)
		}
		out = append(out, sysctl{key: k, value: v})
	}
	slices.SortFunc(out, func(a, b sysctl) int { return strings.Compare(a.key, b.key) })
	return out, nil
}

// SetSysctl writes value to sysctl key under /proc/sys. A key the guest's
// kernel does not have is the caller's error.
func (Linux) SetSysctl(key, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	err := os.WriteFile(path, []byte(value), 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("sysctl %s: the guest's kernel has no such setting: %w", key, errdefs.ErrInvalidArgument)
	case err != nil:
		return fmt.Errorf("sysctl %s = %q: %w", key, value, err)
	}
	return nil
}
