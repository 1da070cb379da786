package main

import "testing"

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		want   cliFlags
		action string
	}{
		{"start as containerd runs it", []string{"-namespace", "ns", "-address", "/c.sock", "-publish-binary", "/bin/containerd", "-id", "t1", "start"},
			cliFlags{namespace: "ns", id: "t1", address: "/c.sock"}, "start"},
		{"start with debug", []string{"-namespace", "ns", "-id", "t1", "-debug", "start"}, cliFlags{namespace: "ns", id: "t1"}, "start"},
		{"delete as containerd runs it", []string{"-namespace", "ns", "-address", "/c.sock", "-publish-binary", "/bin/containerd", "-id", "t1", "-bundle", "/b/t1", "delete"},
			cliFlags{namespace: "ns", id: "t1", address: "/c.sock", bundle: "/b/t1"}, "delete"},
		{"info", []string{"-info"}, cliFlags{}, ""},
		{"version", []string{"-v"}, cliFlags{}, ""},
		{"unknown flag", []string{"-bogus", "start"}, cliFlags{}, ""},
		{"start among other words", []string{"-id", "t1", "start", "now"}, cliFlags{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, action := parseArgs(tt.args)
			if action != tt.action || (action != "" && got != tt.want) {
				t.Fatalf("parseArgs = %+v, %q; want %+v, %q", got, action, tt.want, tt.action)
			}
		})
	}
}
