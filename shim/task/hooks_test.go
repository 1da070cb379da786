package task

import (
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestOCIHooksDeadline: hooks get the task's shim.hook_timeout; a spec
// without hooks never reads the config.
func TestOCIHooksDeadline(t *testing.T) {
	t.Setenv("COCOON_CONFIG", "/dev/null")
	poststop := &specs.Hooks{Poststop: []specs.Hook{{Path: "/bin/true"}}}
	for _, tc := range []struct {
		name  string
		hooks *specs.Hooks
		body  string
		want  time.Duration
		err   string
	}{
		{name: "default", hooks: poststop, want: time.Minute},
		{name: "configured", hooks: poststop, body: "[shim]\nhook_timeout = \"5s\"\n", want: 5 * time.Second},
		{name: "bad config", hooks: poststop, body: "[shim]\nhook_timeout = \"0s\"\n", err: "shim.hook_timeout must be positive"},
		{name: "no hooks, no config read", body: "[shim]\nhook_timeout = \"0s\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := LaunchRequest{ID: "t1", Spec: &specs.Spec{Hooks: tc.hooks}, ConfigBody: tc.body}
			h, err := newOCIHooks(r)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("newOCIHooks: %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil || h.deadline != tc.want {
				t.Fatalf("newOCIHooks: deadline %v (%v), want %v", h.deadline, err, tc.want)
			}
		})
	}
}
