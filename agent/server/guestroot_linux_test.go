package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/api"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestConfinedGuestRoot: a Rootfs without a disk confines the guest's own
// root for the processes, with real mounts in a namespace of their own: a
// masked file reads empty, a read-only path refuses writes and the root is
// mounted read-only there, while the agent's view (this test's) is
// unchanged; the same Rootfs again is a no-op, another one refused.
func TestConfinedGuestRoot(t *testing.T) {
	testenv.RequireRoot(t)
	sh := testenv.LookPath(t, "sh")
	dir := t.TempDir()
	secret, ro := filepath.Join(dir, "secret"), filepath.Join(dir, "ro")
	if err := os.WriteFile(secret, []byte("hidden"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	svc := New(&fakeSystem{j: &journal{}}, WithMounter(LinuxMounts{}), WithStateDir(t.TempDir()))
	root := &api.Rootfs{Readonly: true, MaskedPaths: []string{secret, "/no/such/path"}, ReadonlyPaths: []string{ro}}
	if _, err := svc.Init(context.Background(), &api.InitRequest{Rootfs: root}); err != nil {
		t.Fatal(err)
	}
	script := "cat " + secret + "; echo; touch " + ro + "/x 2>/dev/null && echo ro-writable || echo ro-refused; " +
		"grep -q '^[0-9]* [0-9]* [^ ]* / / ro[, ]' /proc/self/mountinfo && echo root-ro || echo root-rw"
	out, err := runIn(svc, &api.ExecRequest{Id: "p", Args: []string{sh, "-c", script}, Cwd: "/"})
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if want := "\nro-refused\nroot-ro\n"; out != want {
		t.Errorf("the process saw %q, want %q", out, want)
	}
	if data, err := os.ReadFile(secret); err != nil || string(data) != "hidden" {
		t.Errorf("the agent's view changed: %q %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); err != nil {
		t.Errorf("the agent's view of the read-only path changed: %v", err)
	}
	if _, err := svc.Init(context.Background(), &api.InitRequest{Rootfs: root}); err != nil {
		t.Errorf("the same confinement again: %v", err)
	}
	other := &api.Rootfs{Readonly: true}
	if _, err := svc.Init(context.Background(), &api.InitRequest{Rootfs: other}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("another confinement: %v, want failed precondition", err)
	}
}

// TestGuestRootRefusesADisksFields: a Rootfs without a serial is
// confinement alone.
func TestGuestRootRefusesADisksFields(t *testing.T) {
	for _, r := range []*api.Rootfs{{Fstype: "ext4"}, {Mounts: []*api.Mount{{Destination: "/x", Type: "tmpfs"}}}} {
		if err := checkRootfs(r); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "without a disk serial") {
			t.Errorf("checkRootfs(%v): %v, want invalid argument", r, err)
		}
	}
}
