package apifake

import (
	"bytes"
	"testing"
)

func TestMainCommandLine(t *testing.T) {
	t.Setenv(envName, "cloud-hypervisor")
	t.Setenv(envVersion, "v53.0")
	tests := []struct {
		name     string
		args     []string
		code     int
		wantOut  string
		wantErrs bool
	}{
		{"version", []string{"--version"}, 0, "cloud-hypervisor v53.0\n", false},
		{"no api socket", nil, 2, "", true},
		{"unknown flag", []string{"--kernel", "vmlinux"}, 2, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errs bytes.Buffer
			if code := Main(tt.args, &out, &errs); code != tt.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.code, errs.String())
			}
			if out.String() != tt.wantOut || (errs.Len() > 0) != tt.wantErrs {
				t.Errorf("stdout %q stderr %q", out.String(), errs.String())
			}
		})
	}
}
