package main

import (
	"slices"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor"
)

func TestBenchFlags(t *testing.T) {
	tests := []struct {
		name  string
		parse func() (any, error)
		want  any // nil: an error
	}{
		{"counts", func() (any, error) { return parseCounts("n", "1, 8,16", false) }, []int{1, 8, 16}},
		{"zero count", func() (any, error) { return parseCounts("n", "0", false) }, nil},
		{"word count", func() (any, error) { return parseCounts("n", "1,x", false) }, nil},
		{"no counts", func() (any, error) { return parseCounts("n", "", false) }, nil},
		{"arm off", func() (any, error) { return parseCounts("network", "", true) }, []int(nil)},
		{"modes", func() (any, error) { return parseModes("copy,mmap") }, []hypervisor.Mode{hypervisor.ModeCopy, hypervisor.ModeMmap}},
		{"bad mode", func() (any, error) { return parseModes("lazy") }, nil},
		{"paths", func() (any, error) { return parsePaths("direct,shim,runc,cold") }, []string{"direct", "shim", "runc", "cold"}},
		{"bad path", func() (any, error) { return parsePaths("kata") }, nil},
		{"sizes", func() (any, error) { return parseSizes("0,16M,1G") }, []int64{0, 16 << 20, 1 << 30}},
		{"bad size", func() (any, error) { return parseSizes("big") }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse()
			if tt.want == nil {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil || !equal(got, tt.want) {
				t.Fatalf("got %v (err %v), want %v", got, err, tt.want)
			}
		})
	}
}

func equal(a, b any) bool {
	switch a := a.(type) {
	case []int:
		return slices.Equal(a, b.([]int))
	case []string:
		return slices.Equal(a, b.([]string))
	case []int64:
		return slices.Equal(a, b.([]int64))
	case []hypervisor.Mode:
		return slices.Equal(a, b.([]hypervisor.Mode))
	}
	return false
}

func TestRunRefusesUnknownSubcommand(t *testing.T) {
	for _, args := range [][]string{nil, {"bake"}, {"bench", "extra-arg"}, {"bench", "--n", "0"}} {
		if code := run(args); code == 0 {
			t.Errorf("run(%q) = 0, want a failure", args)
		}
	}
}
