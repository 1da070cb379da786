package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func testShape() Shape {
	return Shape{
		Version: shapeVersion, Machine: machineType, Accel: accelTCG, CPU: "max",
		VCPUs: 2, MemoryBytes: 512 << 20, Devices: devices, Cmdline: "console=ttyS0",
	}
}

// argAfter returns the values following each occurrence of flag.
func argAfter(args []string, flag string) []string {
	var vals []string
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			vals = append(vals, args[i+1])
		}
	}
	return vals
}

func TestLaunchArgs(t *testing.T) {
	tests := []struct {
		name      string
		l         launch
		object    string
		kernel    bool
		incoming  bool
		wantAgent string
	}{
		{
			name: "cold boot",
			l: launch{Shape: testShape(), Memory: memory{Path: "/run/vm/memory", Share: true},
				Kernel: "/g/vmlinuz", Initrd: "/g/initramfs.cpio.gz", QMPFD: 3,
				AgentSock: "/run/vm/agent.sock", SerialLog: "/run/vm/serial.log"},
			object:    "memory-backend-file,id=microvm.ram,size=512M,mem-path=/run/vm/memory,share=on",
			kernel:    true,
			wantAgent: "socket,id=agent,path=/run/vm/agent.sock,server=on,wait=off",
		},
		{
			name: "mmap restore of a path with a comma",
			l: launch{Shape: testShape(), Memory: memory{Path: "/staged/a,b/memory"}, QMPFD: 3,
				AgentSock: "/run/a,b/agent.sock", SerialLog: "/run/vm/serial.log", Incoming: true},
			object:    "memory-backend-file,id=microvm.ram,size=512M,mem-path=/staged/a,,b/memory,share=off",
			incoming:  true,
			wantAgent: "socket,id=agent,path=/run/a,,b/agent.sock,server=on,wait=off",
		},
		{
			name: "copy restore from a memfd",
			l: launch{Shape: testShape(), Memory: memory{Path: memfdChildPath, Share: true}, QMPFD: 3,
				AgentSock: "/run/vm/agent.sock", SerialLog: "/run/vm/serial.log", Incoming: true},
			object:    "memory-backend-file,id=microvm.ram,size=512M,mem-path=/proc/self/fd/4,share=on",
			incoming:  true,
			wantAgent: "socket,id=agent,path=/run/vm/agent.sock,server=on,wait=off",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.l.args()
			checks := map[string][]string{
				"-object":  {tt.object},
				"-machine": {"microvm,x-option-roms=off,memory-backend=microvm.ram"},
				"-accel":   {"tcg"},
				"-cpu":     {"max"},
				"-smp":     {"2"},
				"-m":       {"512M"},
				"-mon":     {"chardev=qmp,mode=control"},
				"-device":  {"virtio-serial-device", "virtserialport,chardev=agent,name=agent"},
				"-chardev": {"socket,id=qmp,fd=3,server=on,wait=off", "file,id=serial,path=/run/vm/serial.log", tt.wantAgent},
			}
			for flag, want := range checks {
				if got := argAfter(a, flag); !slices.Equal(got, want) {
					t.Errorf("%s = %q, want %q", flag, got, want)
				}
			}
			if got := len(argAfter(a, "-kernel")) == 1; got != tt.kernel {
				t.Errorf("-kernel present %v, want %v", got, tt.kernel)
			}
			if got := slices.Equal(argAfter(a, "-incoming"), []string{"defer"}) && slices.Contains(a, "-S"); got != tt.incoming {
				t.Errorf("-S -incoming defer present %v, want %v", got, tt.incoming)
			}
		})
	}
}

func TestShapeValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Shape)
		want   string
	}{
		{"ok", func(*Shape) {}, ""},
		{"future version", func(s *Shape) { s.Version = 2 }, "version 2"},
		{"other machine", func(s *Shape) { s.Machine = "q35" }, `machine "q35"`},
		{"no vcpus", func(s *Shape) { s.VCPUs = 0 }, "vcpus 0"},
		{"odd memory", func(s *Shape) { s.MemoryBytes = 1000 }, "memoryBytes 1000"},
		{"no cpu", func(s *Shape) { s.CPU = "" }, "cpu and accel"},
		{"other devices", func(s *Shape) { s.Devices = []string{"virtio-serial-device"} }, "devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testShape()
			tt.modify(&s)
			err := s.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestShapeRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := WriteShape(dir, testShape()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadShape(filepath.Join(dir, ShapeFile))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Devices, devices) || got.MemoryBytes != 512<<20 || got.Cmdline != "console=ttyS0" {
		t.Fatalf("read back %+v", got)
	}
	if err := os.WriteFile(filepath.Join(dir, ShapeFile), []byte(`{"version":1,"machine":"pc"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadShape(filepath.Join(dir, ShapeFile)); err == nil {
		t.Fatal("ReadShape accepted a pc machine")
	}
}
