package testimage

import (
	"bytes"
	"context"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// TestCritestImages writes critest's images into one archive and reads it
// back: every name once, the tags of one image one manifest, the tags of
// different images different ones, pause:3.9 another image than the
// sandbox's pause, and the users critest expects in the configs.
func TestCritestImages(t *testing.T) {
	testenv.LookPath(t, DefaultBusybox)
	ctx := context.Background()
	dir := t.TempDir()
	pause, err := Pause(ctx, "localhost/testimage/pause:1", dir)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := CritestImages(ctx, dir, DefaultBusybox, pause)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteArchive(ctx, &b, append(imgs, pause)...); err != nil {
		t.Fatal(err)
	}
	cs, named := imported(t, b.Bytes())
	if len(named) != len(imgs)+1 {
		t.Fatalf("%d images named in the archive, want %d", len(named), len(imgs)+1)
	}
	digest := func(name string) string {
		d, ok := named[name]
		if !ok {
			t.Fatalf("no image %s", name)
		}
		return d.Digest.String()
	}
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{critestTools + "test-image-tags:1", critestTools + "test-image-tags:3", true},
		{critestTools + "test-image-tag:test", critestTools + "test-image-tag:all", true},
		{critestTools + "test-image-1:latest", critestTools + "test-image-2:latest", false},
		{"registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9", true},
		{"registry.k8s.io/pause:3.9", "localhost/testimage/pause:1", false},
	} {
		if same := digest(tc.a) == digest(tc.b); same != tc.same {
			t.Errorf("%s and %s: same manifest %v, want %v", tc.a, tc.b, same, tc.same)
		}
	}
	for name, user := range map[string]string{
		critestTools + "test-image-user-username-group:latest": "www-data:1004",
		critestTools + "test-image-predefined-group:latest":    "1000",
		critestE2E + "busybox:1.29-2":                          "",
	} {
		var m ocispec.Manifest
		readJSON(t, cs, named[name], &m)
		var cfg ocispec.Image
		readJSON(t, cs, m.Config, &cfg)
		if cfg.Config.User != user {
			t.Errorf("%s: user %q, want %q", name, cfg.Config.User, user)
		}
	}
}
