package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWarm: Warm has runc create the throwaway container and delete it,
// under SCHED_IDLE, deletes it even when the create fails, and leaves no
// bundle either way.
func TestWarm(t *testing.T) {
	const record = "echo \"$(awk '{print $41}' /proc/$$/stat) $*\" >> \"$0.args\"\n" +
		"prev=; for a in \"$@\"; do [ \"$prev\" = --pid-file ] && echo $$ > \"$a\"; prev=$a; done\n"
	for _, tc := range []struct {
		name, script string
		wantErr      bool
	}{
		{name: "creates and deletes", script: record},
		{name: "create fails", script: record + "case \"$*\" in *' create '*) exit 3;; esac\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := filepath.Join(t.TempDir(), "runc")
			if err := os.WriteFile(fake, []byte("#!/bin/sh\n"+tc.script), 0o755); err != nil {
				t.Fatal(err)
			}
			state := t.TempDir()
			err := New(Config{Runc: fake, RuncRoot: t.TempDir(), StateDir: state, CgroupParent: "/test"}).Warm(context.Background(), false)
			if (err != nil) != tc.wantErr {
				t.Fatalf("warm: %v, want an error: %v", err, tc.wantErr)
			}
			data, rerr := os.ReadFile(fake + ".args")
			if rerr != nil {
				t.Fatal(rerr)
			}
			calls := strings.Split(strings.TrimSpace(string(data)), "\n")
			if len(calls) != 2 || !strings.Contains(calls[0], " create --bundle "+filepath.Join(state, warmID)+" ") || !strings.HasSuffix(calls[0], " "+warmID) ||
				!strings.HasSuffix(calls[1], " delete --force "+warmID) {
				t.Fatalf("runc ran as %q, want a create of %s, then its delete", calls, warmID)
			}
			for _, c := range calls {
				// SCHED_IDLE is policy 5 (sched(7)).
				if !strings.HasPrefix(c, "5 ") {
					t.Errorf("runc ran with policy %q, want SCHED_IDLE (5)", strings.Fields(c)[0])
				}
			}
			if _, err := os.Stat(filepath.Join(state, warmID)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the warm-up's bundle is left: %v", err)
			}
		})
	}
}
