package cloudhypervisor

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestPatchConfig(t *testing.T) {
	p, err := patchConfig([]byte(testConfig), "/run/vm1", hostBackends{})
	if err != nil {
		t.Fatal(err)
	}
	if p.ownNetNS || p.rootfs != nil {
		t.Errorf("a config without network device or disk: own netns %v, rootfs slot %+v", p.ownNetNS, p.rootfs)
	}
	var got, want map[string]any
	if err := json.Unmarshal(p.config, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(testConfig), &want); err != nil {
		t.Fatal(err)
	}
	want["vsock"].(map[string]any)["socket"] = "/run/vm1/vsock.sock"
	want["serial"].(map[string]any)["socket"] = "/run/vm1/serial.sock"
	want["payload"] = map[string]any{"kernel": nil, "cmdline": "console=ttyS0", "initramfs": nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("patched config\n got %v\nwant %v", got, want)
	}
}

func TestPatchConfigErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not json", `{`, "parse"},
		{"no vsock", `{"cpus":{}}`, "no vsock device"},
		{"null vsock", `{"vsock":null}`, "no vsock device"},
		{"vsock not an object", `{"vsock":"x"}`, "vsock: want an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := patchConfig([]byte(tt.in), "/run/vm1", hostBackends{}); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
	long := "/" + strings.Repeat("d", 120)
	if _, err := patchConfig([]byte(testConfig), long, hostBackends{}); err == nil || !strings.Contains(err.Error(), "unix sockets allow") {
		t.Errorf("long run dir: err = %v", err)
	}
}
