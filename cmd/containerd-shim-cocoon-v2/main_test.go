package main

import "testing"

func TestParseStart(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		want  cliFlags
		start bool
	}{
		{"start as containerd runs it", []string{"-namespace", "ns", "-address", "/c.sock", "-publish-binary", "/bin/containerd", "-id", "t1", "start"},
			cliFlags{namespace: "ns", id: "t1", address: "/c.sock"}, true},
		{"start with debug", []string{"-namespace", "ns", "-id", "t1", "-debug", "start"}, cliFlags{namespace: "ns", id: "t1"}, true},
		{"delete", []string{"-namespace", "ns", "-id", "t1", "delete"}, cliFlags{}, false},
		{"info", []string{"-info"}, cliFlags{}, false},
		{"version", []string{"-v"}, cliFlags{}, false},
		{"unknown flag", []string{"-bogus", "start"}, cliFlags{}, false},
		{"start among other words", []string{"-id", "t1", "start", "now"}, cliFlags{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, start := parseStart(tt.args)
			if start != tt.start || (start && got != tt.want) {
				t.Fatalf("parseStart = %+v, %v; want %+v, %v", got, start, tt.want, tt.start)
			}
		})
	}
}
