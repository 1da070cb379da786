package qemu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestChooseAccel(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "present")
	if err := os.WriteFile(present, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name       string
		configured string
		h          host
		want       string
		wantErr    bool
	}{
		{"usable kvm", "auto", host{kvmDev: present, pvmMod: missing}, accelKVM, false},
		{"pvm", "auto", host{kvmDev: present, pvmMod: present}, accelTCG, false},
		{"no kvm", "", host{kvmDev: missing, pvmMod: missing}, accelTCG, false},
		{"forced tcg", "tcg", host{kvmDev: present, pvmMod: missing}, accelTCG, false},
		{"forced kvm", "kvm", host{kvmDev: missing, pvmMod: present}, accelKVM, false},
		{"bad value", "hvf", host{kvmDev: present, pvmMod: missing}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reason, err := chooseAccel(tt.configured, tt.h)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("chooseAccel(%q) = %q, %v; want %q (error %v)", tt.configured, got, err, tt.want, tt.wantErr)
			}
			if err == nil && reason == "" {
				t.Fatal("no reason given")
			}
		})
	}
}

func TestCPUModel(t *testing.T) {
	tests := []struct{ configured, accel, want string }{
		{"", accelTCG, "max"},
		{"", accelKVM, "host,-arch-capabilities"},
		{"qemu64", accelKVM, "qemu64"},
	}
	for _, tt := range tests {
		if got := cpuModel(tt.configured, tt.accel); got != tt.want {
			t.Errorf("cpuModel(%q, %q) = %q, want %q", tt.configured, tt.accel, got, tt.want)
		}
	}
}

func TestTCGCmdline(t *testing.T) {
	got := tcgCmdline("console=ttyS0")
	if !strings.HasPrefix(got, "console=ttyS0 "+tscParam) {
		t.Fatalf("tcgCmdline added no TSC frequency: %q", got)
	}
	khz, err := strconv.ParseInt(strings.TrimPrefix(got, "console=ttyS0 "+tscParam), 10, 64)
	if err != nil || khz < 100_000 || khz > 10_000_000 {
		t.Fatalf("implausible TSC frequency in %q", got)
	}
	if kept := "console=ttyS0 tsc_early_khz=1000000"; tcgCmdline(kept) != kept {
		t.Fatalf("tcgCmdline replaced an explicit %s", tscParam)
	}
}
