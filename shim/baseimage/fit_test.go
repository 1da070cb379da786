package baseimage

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
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
		fit          Fit
		want         string
		wantReleased []string
		wantErr      string
	}{
		{"pod fits the middle", bases, Fit{Pod: true, Limit: 300 * mib}, "m", []string{"s"}, ""},
		{"pod fits the smallest", bases, Fit{Pod: true, Limit: 256 * mib}, "s", nil, ""},
		{"pod names no memory", bases, Fit{Pod: true}, "s", nil, ""},
		{"container limit holds the middle", bases, Fit{Limit: 1024 * mib}, "m", []string{"l"}, ""},
		{"container without limit", bases, Fit{}, "s", nil, ""},
		{"pod too big", bases, Fit{Pod: true, Limit: 4096 * mib}, "", []string{"s", "m", "l"}, "none of restore.base_images has at least the pod's 4GiB of guest memory: s (256MiB), m (512MiB), l (2GiB)"},
		{"container limit too small", bases, Fit{Limit: 128 * mib}, "", []string{"l", "m", "s"}, "at most the container's memory limit 128MiB"},
		{"one base is not judged here", []string{"m"}, Fit{Pod: true, Limit: 4096 * mib}, "m", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var released []string
			stage := func(_ context.Context, image string) (fakeBase, int64, error) {
				return fakeBase{image: image, released: &released}, sizes[image], nil
			}
			got, why, err := Pick(context.Background(), tc.bases, tc.fit, stage)
			if tc.wantErr != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Pick: %v, want invalid argument saying %q", err, tc.wantErr)
				}
			} else if err != nil || got.image != tc.want {
				t.Fatalf("Pick: %q, %v; want %q", got.image, err, tc.want)
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
	if _, _, err := Pick(context.Background(), []string{"a", "b"}, Fit{}, stage); !errors.Is(err, boom) {
		t.Fatalf("Pick: %v, want the stage's error", err)
	}
}
