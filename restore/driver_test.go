package restore

import (
	"strings"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/config"
)

func TestNewDriver(t *testing.T) {
	for _, name := range []string{"qemu", "cloud-hypervisor", "firecracker"} {
		cfg := config.Default()
		cfg.Hypervisor = name
		d, err := NewDriver(cfg)
		if err != nil {
			t.Fatalf("NewDriver(%s): %v", name, err)
		}
		if d.Name() != name {
			t.Errorf("NewDriver(%s).Name() = %q", name, d.Name())
		}
	}
	cfg := config.Default()
	cfg.Hypervisor = "xen"
	if _, err := NewDriver(cfg); err == nil || !strings.Contains(err.Error(), `"xen"`) {
		t.Fatalf("NewDriver(xen) error = %v, want one naming it", err)
	}
}
