package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWarm: Warm runs the manager's runc with --version only, and fails
// when runc does.
func TestWarm(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		wantErr      bool
	}{
		{name: "runs", script: "echo \"$@\" >> \"$0.args\"\necho 'runc version 1.5.3'\n"},
		{name: "fails", script: "echo \"$@\" >> \"$0.args\"\nexit 3\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := filepath.Join(t.TempDir(), "runc")
			if err := os.WriteFile(fake, []byte("#!/bin/sh\n"+tc.script), 0o755); err != nil {
				t.Fatal(err)
			}
			err := New(Config{Runc: fake}).Warm(context.Background())
			if (err != nil) != tc.wantErr {
				t.Fatalf("warm: %v, want an error: %v", err, tc.wantErr)
			}
			args, rerr := os.ReadFile(fake + ".args")
			if rerr != nil || strings.TrimSpace(string(args)) != "--version" {
				t.Fatalf("runc ran with %q (%v), want --version alone, once", args, rerr)
			}
		})
	}
}
