package container

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStartTellsRunc: a container started through its exec fifo, without
// `runc start`, is running as runc sees it, and its fifo is gone.
func TestStartTellsRunc(t *testing.T) {
	m := testManager(t)
	c := startSleeper(t, m, "started", busyboxRoot(t))
	st, err := c.rt.State(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != "running" || st.Pid != c.init.pid {
		t.Errorf("runc says %s, pid %d; want running, pid %d", st.Status, st.Pid, c.init.pid)
	}
	if _, err := os.Stat(filepath.Join(c.rt.Root, c.ID, execFifo)); !os.IsNotExist(err) {
		t.Errorf("exec fifo after the start: %v, want it gone", err)
	}
	if _, err := c.Start(context.Background()); err == nil {
		t.Error("a second start succeeded")
	}
}

// TestOpenExecFifo: the open returns once a writer comes, and fails,
// without hanging, when the init ends first or the caller gives up.
func TestOpenExecFifo(t *testing.T) {
	tests := []struct {
		name   string
		writer bool // a writer opens the fifo and writes its byte
		ended  bool // the init has ended
		cancel bool // the caller's context ends
		ok     bool
	}{
		{name: "started", writer: true, ok: true},
		{name: "init ended", ended: true},
		{name: "given up", cancel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), execFifo)
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
			if tt.writer {
				go func() {
					if w, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
						w.Write([]byte("0"))
						w.Close()
					}
				}()
			}
			ended := make(chan struct{})
			if tt.ended {
				close(ended)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tt.cancel {
				go func() { time.Sleep(20 * time.Millisecond); cancel() }()
			}
			f, err := openExecFifo(ctx, path, ended)
			if (err == nil) != tt.ok {
				t.Fatalf("open: %v, want success %v", err, tt.ok)
			}
			if f != nil {
				f.Close()
			}
			if ctx.Err() == context.DeadlineExceeded {
				t.Error("the open took until the test's deadline")
			}
		})
	}
}
