package container

import (
	"context"
	"github.com/containerd/containerd/v2/core/containers"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestConfinement runs containers through the manager and the host's runc
// and checks, from inside each, that what its spec asks holds.
func TestConfinement(t *testing.T) {
	m := testManager(t)
	rootfs := busyboxRoot(t)
	status := "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
	for _, tc := range []struct {
		name   string
		script string
		opts   []oci.SpecOpts
		want   []string // in stdout
		wantNo []string // not in stdout
	}{
		{name: "caps-dropped", script: status, opts: []oci.SpecOpts{oci.WithCapabilities(nil)}, want: []string{"CapEff:\t0000000000000000"}},
		{name: "seccomp", script: status, opts: []oci.SpecOpts{seccomp.WithDefaultProfile()}, want: []string{"Seccomp:\t2"}},
		{name: "no-new-privs", script: status, opts: []oci.SpecOpts{oci.WithNoNewPrivileges}, want: []string{"NoNewPrivs:\t1"}},
		{name: "defaults", script: status, want: []string{"Seccomp:\t0"}, wantNo: []string{"CapEff:\t0000000000000000"}},
		{name: "new-privs-allowed", script: status, opts: []oci.SpecOpts{withNewPrivileges}, want: []string{"NoNewPrivs:\t0"}},
		{
			name: "readonly-root", script: "touch /x 2>&1; echo rc=$?",
			opts: []oci.SpecOpts{oci.WithRootFSReadonly()}, want: []string{"Read-only file system", "rc=1"},
		},
		{name: "writable-root", script: "touch /x 2>&1; echo rc=$?", want: []string{"rc=0"}},
		{
			name: "masked-path", script: "cat /etc/secret; echo end",
			opts: []oci.SpecOpts{oci.WithMaskedPaths([]string{"/etc/secret"})}, want: []string{"end"}, wantNo: []string{"s3cret"},
		},
		{name: "default-masked-and-readonly", script: "wc -c </proc/timer_list; (echo 1 >/proc/sys/vm/drop_caches) 2>&1; true", want: []string{"0\n", "Read-only file system"}},
		{name: "pid-namespace", script: "echo pid=$$", want: []string{"pid=1\n"}},
		{name: "rlimit", script: "ulimit -n", opts: []oci.SpecOpts{oci.WithRlimit(&specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Soft: 123, Hard: 123})}, want: []string{"123"}},
		{name: "sysctl", script: "cat /proc/sys/kernel/shm_rmid_forced", opts: []oci.SpecOpts{withSysctl("kernel.shm_rmid_forced", "1")}, want: []string{"1\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]oci.SpecOpts{oci.WithProcessArgs("sh", "-c", tc.script)}, tc.opts...)
			stdout, stderr, e := runContainer(t, m, tc.name, rootfs, opts...)
			if e.Code != 0 || e.OOMKilled {
				t.Fatalf("exit %+v, stdout %q, stderr %q", e, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout %q lacks %q (stderr %q)", stdout, w, stderr)
				}
			}
			for _, w := range tc.wantNo {
				if strings.Contains(stdout, w) {
					t.Errorf("stdout %q has %q", stdout, w)
				}
			}
		})
	}
}

func withSysctl(key, value string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		s.Linux.Sysctl[key] = value
		return nil
	}
}

func withNewPrivileges(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Process.NoNewPrivileges = false
	return nil
}
