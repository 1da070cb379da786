package drivers

import (
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
)

func TestNew(t *testing.T) {
	for _, name := range []string{"qemu", "cloud-hypervisor", "firecracker"} {
		cfg := config.Default()
		cfg.Hypervisor = name
		d, err := New(cfg)
		if err != nil {
			t.Fatalf("New(%s): %v", name, err)
		}
		if d.Name() != name {
			t.Errorf("New(%s).Name() = %q", name, d.Name())
		}
	}
	cfg := config.Default()
	cfg.Hypervisor = "xen"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), `"xen"`) {
		t.Fatalf("New(xen) error = %v, want one naming it", err)
	}
}
