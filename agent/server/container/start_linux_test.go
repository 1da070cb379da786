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
	st, err := c.eng.(runcEngine).rt.State(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != "running" || st.Pid != c.init.pid {
		t.Errorf("runc says %s, pid %d; want running, pid %d", st.Status, st.Pid, c.init.pid)
	}
	if _, err := os.Stat(filepath.Join(c.eng.(runcEngine).rt.Root, c.ID, execFifo)); !os.IsNotExist(err) {
		t.Errorf("exec fifo after the start: %v, want it gone", err)
	}
	if _, err := c.Start(context.Background()); err == nil {
		t.Error("a second start succeeded")
	}
}

// TestReadExecFifo: the read returns the init's byte once a writer comes,
// even when the init ends right after it; nothing, without hanging, when
// the init ends without writing; and an error when the caller gives up.
func TestReadExecFifo(t *testing.T) {
	tests := []struct {
		name   string
		writer bool // a writer opens the fifo and writes its byte
		ended  bool // the init has ended (after its write, with writer)
		cancel bool // the caller's context ends
		want   string
		err    bool
	}{
		{name: "started", writer: true, want: "0"},
		{name: "started and ended", writer: true, ended: true, want: "0"},
		{name: "init ended", ended: true, want: ""},
		{name: "given up", cancel: true, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), execFifo)
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
			ended := make(chan struct{})
			switch {
			case tt.writer:
				go func() {
					if w, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
						w.Write([]byte("0"))
						w.Close()
					}
					if tt.ended {
						close(ended)
					}
				}()
			case tt.ended:
				close(ended)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tt.cancel {
				go func() { time.Sleep(20 * time.Millisecond); cancel() }()
			}
			data, err := readExecFifo(ctx, path, ended)
			if (err != nil) != tt.err || string(data) != tt.want {
				t.Fatalf("read %q, %v; want %q, an error: %v", data, err, tt.want, tt.err)
			}
			if ctx.Err() == context.DeadlineExceeded {
				t.Error("the read took until the test's deadline")
			}
		})
	}
}
