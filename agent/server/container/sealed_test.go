package container

import (
	"os"
	"os/exec"
	"testing"
)

// TestSealedCopy: the copy runs as the binary does, and nothing can
// write it, nor grow or shrink it.
func TestSealedCopy(t *testing.T) {
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Fatalf("no true on this machine: %v", err)
	}
	f, err := sealedCopy(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if out, err := exec.Command(execPath(f)).CombinedOutput(); err != nil {
		t.Fatalf("run the copy: %v\n%s", err, out)
	}
	w, err := os.OpenFile(execPath(f), os.O_WRONLY, 0)
	if err == nil {
		_, err = w.Write([]byte("x"))
		w.Close()
	}
	if err == nil {
		t.Error("wrote the sealed copy")
	}
	if err := f.Truncate(0); err == nil {
		t.Error("truncated the sealed copy")
	}
}
