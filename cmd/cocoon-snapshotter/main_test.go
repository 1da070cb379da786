package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunRejectsBadSettings(t *testing.T) {
	dir := t.TempDir()
	badConfig := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(badConfig, []byte("[snapshotter]\nflat_cache_sise = \"1G\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--rooot", dir}, "flag provided but not defined"},
		{"positional argument", []string{dir}, "unexpected arguments"},
		{"bad log level", []string{"--log-level", "loud"}, "--log-level"},
		{"unknown config key", []string{"--config", badConfig}, "snapshotter.flat_cache_sise"},
		{"missing config", []string{"--config", filepath.Join(dir, "none.toml")}, "read config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}
