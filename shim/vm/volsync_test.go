package vm

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// dirUpdater applies UpdateFiles to a directory standing for the guest's
// root, and records each call's paths in order.
type dirUpdater struct {
	root  string
	calls [][]string
}

func (d *dirUpdater) UpdateFiles(_ context.Context, files []agent.File, remove []string) error {
	var call []string
	for _, f := range files {
		p := filepath.Join(d.root, f.Path)
		call = append(call, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		var err error
		switch {
		case f.Mode.IsDir():
			err = os.MkdirAll(p, 0o755)
		case f.Mode&fs.ModeSymlink != 0:
			tmp := p + ".tmp"
			if err = os.Symlink(string(f.Data), tmp); err == nil {
				err = os.Rename(tmp, p)
			}
		default:
			err = os.WriteFile(p, f.Data, 0o644)
		}
		if err != nil {
			return err
		}
	}
	for _, r := range remove {
		call = append(call, "-"+r)
		if err := os.RemoveAll(filepath.Join(d.root, r)); err != nil {
			return err
		}
	}
	d.calls = append(d.calls, call)
	return nil
}

func TestVolumeSync(t *testing.T) {
	host := filepath.Join(t.TempDir(), "pods/uid/volumes/kubernetes.io~configmap/cfg")
	if !liveVolume.MatchString(host) {
		t.Fatalf("%s is not taken for a live volume", host)
	}
	testenv.WriteVolumeVersion(t, host, "..v1", map[string]string{"a": "1", "b": "1"})
	guest := podBindSources + "/1"
	copies := testCopies()
	b := binds{budget: copies}
	if err := b.copy(host, guest); err != nil {
		t.Fatal(err)
	}
	if err := copies.take(b.used); err != nil {
		t.Fatal(err)
	}
	u := &dirUpdater{root: t.TempDir()}
	if err := u.UpdateFiles(context.Background(), b.files, nil); err != nil {
		t.Fatal(err)
	}
	v := newVolumeSync(host, guest, u, copies, b.files)
	read := func(key string) string {
		data, err := os.ReadFile(filepath.Join(u.root, guest, key))
		if err != nil {
			return "missing"
		}
		return string(data)
	}
	if err := v.sync(context.Background()); err != nil || len(u.calls) != 1 {
		t.Fatalf("a sync with nothing new: %v, %d calls", err, len(u.calls)-1)
	}
	testenv.WriteVolumeVersion(t, host, "..v2", map[string]string{"a": "2", "c": "2"})
	if err := v.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := []string{read("a"), read("b"), read("c")}; strings.Join(got, ",") != "2,missing,2" {
		t.Fatalf("after the update a, b, c read %v, want 2, missing, 2", got)
	}
	call := strings.Join(u.calls[1], " ")
	want := []string{guest + "/..v2/a", guest + "/..data", guest + "/c", "-" + guest + "/b", "-" + guest + "/..v1"}
	last := -1
	for _, w := range want {
		i := strings.Index(call, w)
		if i <= last {
			t.Fatalf("the update %q does not have %q after what comes before it: want the order %v", call, w, want)
		}
		last = i
	}
	if strings.Contains(call, guest+"/a ") {
		t.Fatalf("the update rewrote key a's unchanged link: %q", call)
	}
	entries, _ := os.ReadDir(filepath.Join(u.root, guest))
	if len(entries) != 4 { // ..data, ..v2, a, c
		t.Fatalf("the guest's copy holds %d entries, want 4", len(entries))
	}
	now := binds{budget: testCopies()}
	if err := now.copy(host, guest); err != nil {
		t.Fatal(err)
	}
	if copies.held != now.used {
		t.Fatalf("the VM's copies take %+v after the update, want %+v, as a new copy", copies.held, now.used)
	}
}

func TestVolumeSyncRefusesOddData(t *testing.T) {
	host := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(host, volumeData)); err != nil {
		t.Fatal(err)
	}
	v := newVolumeSync(host, podBindSources+"/1", &dirUpdater{root: t.TempDir()}, testCopies(), nil)
	if err := v.sync(context.Background()); err == nil || !strings.Contains(err.Error(), "expected a directory of the volume's own") {
		t.Fatalf("..data naming /etc: %v", err)
	}
}

// TestVolumeWatch: kubelet's swap of ..data wakes the watch.
func TestVolumeWatch(t *testing.T) {
	dir := t.TempDir()
	w, err := watchVolume(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	testenv.WriteVolumeVersion(t, dir, "..v1", map[string]string{"a": "1"})
	select {
	case <-w.Events:
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up within 5 s of an update")
	}
}
