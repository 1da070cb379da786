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

// testLaunch is a restore's launch of testShape on a TCG host.
func testLaunch() launch {
	return launch{Shape: testShape(), Accel: accelTCG, CPU: "max", QMPFD: 3,
		AgentSock: "/run/vm/agent.sock", SerialLog: "/run/vm/serial.log", Incoming: true}
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
			l: launch{Shape: testShape(), Accel: accelTCG, CPU: "max", Memory: memory{Path: "/run/vm/memory", Share: true},
				Kernel: "/g/vmlinuz", Initrd: "/g/initramfs.cpio.gz", QMPFD: 3,
				AgentSock: "/run/vm/agent.sock", SerialLog: "/run/vm/serial.log"},
			object:    "memory-backend-file,id=microvm.ram,size=512M,mem-path=/run/vm/memory,share=on",
			kernel:    true,
			wantAgent: "socket,id=agent,path=/run/vm/agent.sock,server=on,wait=off",
		},
		{
			name: "mmap restore of a path with a comma",
			l: launch{Shape: testShape(), Accel: accelTCG, CPU: "max", Memory: memory{Path: "/staged/a,b/memory"}, QMPFD: 3,
				AgentSock: "/run/a,b/agent.sock", SerialLog: "/run/vm/serial.log", Incoming: true},
			object:    "memory-backend-file,id=microvm.ram,size=512M,mem-path=/staged/a,,b/memory,share=off",
			incoming:  true,
			wantAgent: "socket,id=agent,path=/run/a,,b/agent.sock,server=on,wait=off",
		},
		{
			name: "copy restore from a memfd",
			l: launch{Shape: testShape(), Accel: accelTCG, CPU: "max", Memory: memory{Path: memfdChildPath, Share: true}, QMPFD: 3,
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
				"-device": {"virtio-serial-device", "virtserialport,chardev=agent,name=agent",
					"virtio-net-device,id=net0,mac=02:c0:c0:00:00:01",
					"virtio-blk-device,id=rootfs,drive=rootfs,serial=cocoon-rootfs"},
				"-netdev":   nil,
				"-blockdev": {`{"driver":"raw","file":{"driver":"null-co","node-name":"rootfs.0","read-only":true,"read-zeroes":true,"size":1099511627776},"node-name":"rootfs","read-only":true}`},
				"-chardev":  {"socket,id=qmp,fd=3,server=on,wait=off", "file,id=serial,path=/run/vm/serial.log", tt.wantAgent},
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
		{"version 1", func(s *Shape) { s.Version = 1 }, "version 1: the snapshot predates the NIC and rootfs slots every snapshot now has; re-bake it"},
		{"future version", func(s *Shape) { s.Version = 3 }, "version 3"},
		{"other machine", func(s *Shape) { s.Machine = "q35" }, `machine "q35"`},
		{"no vcpus", func(s *Shape) { s.VCPUs = 0 }, "vcpus 0"},
		{"odd memory", func(s *Shape) { s.MemoryBytes = 1000 }, "memoryBytes 1000"},
		{"no cpu", func(s *Shape) { s.CPU = "" }, "cpu and accel"},
		{"other devices", func(s *Shape) { s.Devices = []string{"virtio-serial-device"} }, "devices"},
		{"version 1 devices", func(s *Shape) { s.Devices = devices[:2] }, "devices"},
		{"disk slots", func(s *Shape) { s.DiskSlots, s.Devices = 8, machineDevices(8) }, ""},
		{"most disk slots", func(s *Shape) { s.DiskSlots, s.Devices = MaxDiskSlots, machineDevices(MaxDiskSlots) }, ""},
		{"too many disk slots", func(s *Shape) { s.DiskSlots, s.Devices = MaxDiskSlots+1, machineDevices(MaxDiskSlots+1) }, "diskSlots 17: want 0 to 16"},
		{"negative disk slots", func(s *Shape) { s.DiskSlots = -1 }, "diskSlots -1"},
		{"disk slots without their devices", func(s *Shape) { s.DiskSlots = 2 }, "for 2 disk slots"},
		{"slot devices without the count", func(s *Shape) { s.Devices = machineDevices(2) }, "for 0 disk slots"},
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
	slots := testShape()
	slots.DiskSlots, slots.Devices = 3, machineDevices(3)
	if err := WriteShape(dir, slots); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadShape(filepath.Join(dir, ShapeFile)); err != nil || got.DiskSlots != 3 {
		t.Fatalf("read back %+v, %v; want 3 disk slots", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, ShapeFile), []byte(`{"version":1,"machine":"pc"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadShape(filepath.Join(dir, ShapeFile)); err == nil {
		t.Fatal("ReadShape accepted a pc machine")
	}
}

// TestLaunchAttachments checks the NIC and rootfs slot with and without
// backends: the devices never change (the migration stream holds them),
// only their backends do.
func TestLaunchAttachments(t *testing.T) {
	const (
		nic    = "virtio-net-device,id=net0,mac=02:c0:c0:00:00:01"
		blk    = "virtio-blk-device,id=rootfs,drive=rootfs,serial=cocoon-rootfs"
		null   = `{"driver":"raw","file":{"driver":"null-co","node-name":"rootfs.0","read-only":true,"read-zeroes":true,"size":1099511627776},"node-name":"rootfs","read-only":true}`
		serial = "virtio-serial-device"
		port   = "virtserialport,chardev=agent,name=agent"
	)
	tests := []struct {
		name                   string
		tapFD                  int
		disk                   string
		device, netdev, blocks []string
	}{
		{"no nic, no disk", 0, "", []string{serial, port, nic, blk}, nil, []string{null}},
		{"nic", 5, "", []string{serial, port, nic + ",netdev=net0", blk}, []string{"tap,id=net0,fd=5"}, []string{null}},
		{"disk with a comma", 0, "/img/a,b.erofs", []string{serial, port, nic, blk}, nil,
			[]string{`{"driver":"raw","file":{"driver":"file","filename":"/img/a,b.erofs"},"node-name":"rootfs","read-only":true}`}},
		{"nic and disk", 4, "/img/r.erofs", []string{serial, port, nic + ",netdev=net0", blk}, []string{"tap,id=net0,fd=4"},
			[]string{`{"driver":"raw","file":{"driver":"file","filename":"/img/r.erofs"},"node-name":"rootfs","read-only":true}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLaunch()
			l.TapFD, l.Disk = tt.tapFD, tt.disk
			a := l.args()
			for flag, want := range map[string][]string{"-device": tt.device, "-netdev": tt.netdev, "-blockdev": tt.blocks} {
				if got := argAfter(a, flag); !slices.Equal(got, want) {
					t.Errorf("%s = %q, want %q", flag, got, want)
				}
			}
		})
	}
}

func TestAttachFiles(t *testing.T) {
	memfd, tap := os.NewFile(100, "memfd"), os.NewFile(101, "tap")
	tests := []struct {
		name  string
		a     attach
		extra []*os.File
		tapFD int
	}{
		{"nothing", attach{}, nil, 0},
		{"memfd", attach{memfd: memfd}, []*os.File{memfd}, 0},
		{"tap", attach{tap: tap}, []*os.File{tap}, 4},
		{"memfd and tap", attach{memfd: memfd, tap: tap}, []*os.File{memfd, tap}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			extra, tapFD := tt.a.files()
			if !slices.Equal(extra, tt.extra) || tapFD != tt.tapFD {
				t.Errorf("files() = %v, %d; want %v, %d", extra, tapFD, tt.extra, tt.tapFD)
			}
		})
	}
}
