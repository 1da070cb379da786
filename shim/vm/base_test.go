package vm

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/baseimage"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

const mib = int64(1 << 20)

// TestFitOf: a pod's sandbox fits CRI's sandbox-memory annotation, else
// its memory limit; a container its memory limit.
func TestFitOf(t *testing.T) {
	limit := 700 * mib
	withLimit := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}}
	sandbox := &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox", sandboxMemoryAnnotation: "1073741824"}}
	for _, tc := range []struct {
		name string
		r    task.LaunchRequest
		want baseimage.Fit
	}{
		{"container with a limit", task.LaunchRequest{Spec: withLimit}, baseimage.Fit{Limit: limit}},
		{"container without", task.LaunchRequest{Spec: &specs.Spec{}}, baseimage.Fit{}},
		{"pod sandbox", task.LaunchRequest{Spec: sandbox}, baseimage.Fit{Pod: true, Limit: 1024 * mib}},
		{"bare pod with a limit", task.LaunchRequest{Bare: true, Spec: withLimit}, baseimage.Fit{Pod: true, Limit: limit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fitOf(tc.r); got != tc.want {
				t.Errorf("fitOf: %+v, want %+v", got, tc.want)
			}
		})
	}
}
