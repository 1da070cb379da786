package vm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

const mib = int64(1 << 20)

// fakeBase is a staged base that records its release.
type fakeBase struct {
	image    string
	released *[]string
}

func (b fakeBase) Release() error {
	*b.released = append(*b.released, b.image)
	return nil
}

// TestPickBase: of bases listed smallest first, a pod's VM gets the
// smallest that holds the pod's memory, a container's own VM the largest
// its limit holds, one with no memory named the smallest; those staged
// and not fitting are let go, and none fitting fails naming every size.
func TestPickBase(t *testing.T) {
	sizes := map[string]int64{"s": 256 * mib, "m": 512 * mib, "l": 2048 * mib}
	bases := []string{"s", "m", "l"}
	for _, tc := range []struct {
		name         string
		bases        []string
		fit          baseFit
		want         string
		wantReleased []string
		wantErr      string
	}{
		{"pod fits the middle", bases, baseFit{pod: true, limit: 300 * mib}, "m", []string{"s"}, ""},
		{"pod fits the smallest", bases, baseFit{pod: true, limit: 256 * mib}, "s", nil, ""},
		{"pod names no memory", bases, baseFit{pod: true}, "s", nil, ""},
		{"container limit holds the middle", bases, baseFit{limit: 1024 * mib}, "m", []string{"l"}, ""},
		{"container without limit", bases, baseFit{}, "s", nil, ""},
		{"pod too big", bases, baseFit{pod: true, limit: 4096 * mib}, "", []string{"s", "m", "l"}, "none of restore.base_images has at least the pod's 4GiB of guest memory: s (256MiB), m (512MiB), l (2GiB)"},
		{"container limit too small", bases, baseFit{limit: 128 * mib}, "", []string{"l", "m", "s"}, "at most the container's memory limit 128MiB"},
		{"one base is not judged here", []string{"m"}, baseFit{pod: true, limit: 4096 * mib}, "m", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var released []string
			stage := func(_ context.Context, image string) (fakeBase, int64, error) {
				return fakeBase{image: image, released: &released}, sizes[image], nil
			}
			got, why, err := pickBase(context.Background(), tc.bases, tc.fit, stage)
			if tc.wantErr != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("pickBase: %v, want invalid argument saying %q", err, tc.wantErr)
				}
			} else if err != nil || got.image != tc.want {
				t.Fatalf("pickBase: %q, %v; want %q", got.image, err, tc.want)
			}
			if !slices.Equal(released, tc.wantReleased) {
				t.Errorf("released %v, want %v", released, tc.wantReleased)
			}
			if len(tc.bases) > 1 && tc.wantErr == "" && !strings.HasPrefix(why, "base snapshot "+tc.want+" (") {
				t.Errorf("reason %q, want it to name %s and its size", why, tc.want)
			}
		})
	}
}

// TestPickBaseStageFails: a base that cannot be staged fails the pick.
func TestPickBaseStageFails(t *testing.T) {
	boom := errors.New("no such image")
	stage := func(context.Context, string) (fakeBase, int64, error) { return fakeBase{}, 0, boom }
	if _, _, err := pickBase(context.Background(), []string{"a", "b"}, baseFit{}, stage); !errors.Is(err, boom) {
		t.Fatalf("pickBase: %v, want the stage's error", err)
	}
}

// TestFitOf: a pod's sandbox fits CRI's sandbox-memory annotation, else
// its memory limit; a container its memory limit.
func TestFitOf(t *testing.T) {
	limit := 700 * mib
	withLimit := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}}
	sandbox := &specs.Spec{Annotations: map[string]string{"io.kubernetes.cri.container-type": "sandbox", sandboxMemoryAnnotation: "1073741824"}}
	for _, tc := range []struct {
		name string
		r    task.LaunchRequest
		want baseFit
	}{
		{"container with a limit", task.LaunchRequest{Spec: withLimit}, baseFit{limit: limit}},
		{"container without", task.LaunchRequest{Spec: &specs.Spec{}}, baseFit{}},
		{"pod sandbox", task.LaunchRequest{Spec: sandbox}, baseFit{pod: true, limit: 1024 * mib}},
		{"bare pod with a limit", task.LaunchRequest{Bare: true, Spec: withLimit}, baseFit{pod: true, limit: limit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fitOf(tc.r); got != tc.want {
				t.Errorf("fitOf: %+v, want %+v", got, tc.want)
			}
		})
	}
}
