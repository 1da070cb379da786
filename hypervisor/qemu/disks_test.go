package qemu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

func TestDiskSlotArgs(t *testing.T) {
	l := testLaunch()
	l.Shape.DiskSlots, l.Shape.Devices = 2, machineDevices(2)
	a := l.args()
	wantDevices := []string{"virtio-serial-device", "virtserialport,chardev=agent,name=agent",
		"virtio-net-device,id=net0,mac=02:c0:c0:00:00:01",
		"virtio-blk-device,id=rootfs,drive=rootfs,serial=cocoon-rootfs",
		"virtio-blk-device,id=disk0,drive=disk0,serial=cocoon-disk-0",
		"virtio-blk-device,id=disk1,drive=disk1,serial=cocoon-disk-1"}
	if got := argAfter(a, "-device"); !slices.Equal(got, wantDevices) {
		t.Errorf("-device = %q, want %q", got, wantDevices)
	}
	wantBlocks := []string{`{"driver":"raw","file":{"driver":"null-co","node-name":"rootfs.0","read-only":true,"read-zeroes":true,"size":1099511627776},"node-name":"rootfs","read-only":true}`,
		`{"driver":"raw","file":{"driver":"null-co","node-name":"disk0.0","read-only":true,"read-zeroes":true,"size":1099511627776},"node-name":"disk0","read-only":true}`,
		`{"driver":"raw","file":{"driver":"null-co","node-name":"disk1.0","read-only":true,"read-zeroes":true,"size":1099511627776},"node-name":"disk1","read-only":true}`}
	if got := argAfter(a, "-blockdev"); !slices.Equal(got, wantBlocks) {
		t.Errorf("-blockdev = %q, want %q", got, wantBlocks)
	}
}

// blockQMP plays QEMU's block layer for AttachDisk and DetachDisk: it logs
// each command with its arguments and refuses those listed in refuse.
type blockQMP struct {
	mu     sync.Mutex
	log    []string
	refuse map[string]bool
}

// serveBlock answers until the test closes the connection.
func serveBlock(f *fakeQMP, b *blockQMP) {
	go func() {
		for {
			line, err := f.r.ReadBytes('\n')
			if err != nil {
				return
			}
			var c struct {
				Execute   string          `json:"execute"`
				ID        string          `json:"id"`
				Arguments json.RawMessage `json:"arguments"`
			}
			if err := json.Unmarshal(line, &c); err != nil {
				return
			}
			id, entry := c.ID, c.Execute+" "+string(c.Arguments)
			b.mu.Lock()
			b.log = append(b.log, entry)
			refused := b.refuse[entry]
			b.mu.Unlock()
			if refused {
				f.send(`{"error": {"class": "GenericError", "desc": "refused by the test"}, "id": "` + id + `"}`)
			} else {
				f.send(`{"return": {}, "id": "` + id + `"}`)
			}
		}
	}()
}

func (b *blockQMP) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.log
	b.log = nil
	return l
}

func jsonArgs(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func addFile(t *testing.T, node, path string) string {
	return "blockdev-add " + jsonArgs(t, imageDisk(node, path))
}

func addEmpty(t *testing.T, node string) string {
	return "blockdev-add " + jsonArgs(t, emptyDisk(node))
}

func reopen(slot, file string) string {
	return `blockdev-reopen {"options":[{"driver":"raw","file":"` + file + `","node-name":"` + slot + `","read-only":true}]}`
}

func del(node string) string { return `blockdev-del {"node-name":"` + node + `"}` }

// TestSwapDiskQMP: each attach or detach adds a node of a new name,
// reopens the slot's raw node over it and deletes the node it replaced,
// but for the command line's (its raw node owns it). A refused reopen
// deletes the node it added and leaves the slot as it was.
func TestSwapDiskQMP(t *testing.T) {
	dir := t.TempDir()
	imgA, imgB := filepath.Join(dir, "a.erofs"), filepath.Join(dir, "b.erofs")
	for _, p := range []string{imgA, imgB} {
		if err := os.WriteFile(p, make([]byte, 4096), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	f, q := dialFake(t)
	b := &blockQMP{refuse: map[string]bool{reopen("disk2", "disk2.4"): true}}
	serveBlock(f, b)
	v := &VM{qmp: q, shape: Shape{DiskSlots: 4}}
	ctx := context.Background()
	steps := []struct {
		name    string
		do      func() error
		want    []string
		wantErr string
	}{
		{"attach to an empty slot", func() error { return attachSlot(ctx, v, 1, imgA) },
			[]string{addFile(t, "disk1.1", imgA), reopen("disk1", "disk1.1")}, ""},
		{"detach", func() error { return v.DetachDisk(ctx, 1) },
			[]string{addEmpty(t, "disk1.2"), reopen("disk1", "disk1.2"), del("disk1.1")}, ""},
		{"attach again", func() error { return attachSlot(ctx, v, 1, imgB) },
			[]string{addFile(t, "disk1.3", imgB), reopen("disk1", "disk1.3"), del("disk1.2")}, ""},
		{"reopen refused", func() error { return attachSlot(ctx, v, 2, imgA) },
			[]string{addFile(t, "disk2.4", imgA), reopen("disk2", "disk2.4"), del("disk2.4")},
			"attach " + imgA + " to disk slot 2: qmp blockdev-reopen: GenericError: refused by the test"},
		{"attach after a refusal", func() error { return attachSlot(ctx, v, 2, imgA) },
			[]string{addFile(t, "disk2.5", imgA), reopen("disk2", "disk2.5")}, ""},
	}
	for _, s := range steps {
		err := s.do()
		if s.wantErr == "" && err != nil || s.wantErr != "" && (err == nil || err.Error() != s.wantErr) {
			t.Errorf("%s: err %v, want %q", s.name, err, s.wantErr)
		}
		if got := b.take(); !slices.Equal(got, s.want) {
			t.Errorf("%s: qmp\n%s\nwant\n%s", s.name, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// attachSlot is AttachDisk, checking the serial it returns.
func attachSlot(ctx context.Context, v *VM, slot int, path string) error {
	serial, err := v.AttachDisk(ctx, slot, path)
	if err == nil && serial != diskSerial(slot) {
		return &QMPError{Class: "test", Desc: "serial " + serial + ", want " + diskSerial(slot)}
	}
	return err
}

// TestAttachDiskRefusals: a slot the snapshot lacks or a path that is no
// image fails before QEMU is asked anything.
func TestAttachDiskRefusals(t *testing.T) {
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	f, q := dialFake(t)
	b := &blockQMP{}
	serveBlock(f, b)
	v := &VM{qmp: q, shape: Shape{DiskSlots: 2}}
	tests := []struct {
		name    string
		slot    int
		path    string
		want    string
		invalid bool
	}{
		{"negative slot", -1, img, "disk slot -1: the snapshot has 2 spare disk slots (0 to 1)", true},
		{"slot past the last", 2, img, "disk slot 2: the snapshot has 2 spare disk slots (0 to 1)", true},
		{"missing image", 0, "/nonexistent/img", "rootfs disk: stat /nonexistent/img", false},
		{"a directory", 0, "/", "rootfs disk / is not a regular file", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := v.AttachDisk(context.Background(), tt.slot, tt.path)
			if err == nil || !strings.Contains(err.Error(), tt.want) || errdefs.IsInvalidArgument(err) != tt.invalid {
				t.Errorf("AttachDisk: %v, want an error containing %q (invalid argument %v)", err, tt.want, tt.invalid)
			}
		})
	}
	if err := v.DetachDisk(context.Background(), 5); !errdefs.IsInvalidArgument(err) {
		t.Errorf("DetachDisk of slot 5: %v, want an invalid argument", err)
	}
	if got := b.take(); len(got) != 0 {
		t.Errorf("qemu was asked %q", got)
	}
}
