package task

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/stdio"
)

// closeRecorder is a guest stream that records Close.
type closeRecorder struct {
	io.Reader
	mu     sync.Mutex
	closed bool
}

func (r *closeRecorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

func (r *closeRecorder) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// TestAttachIOFailureClosesGuestStreams fails to open the outputs: the
// guest's streams must be closed, not left to the caller.
func TestAttachIOFailureClosesGuestStreams(t *testing.T) {
	out := &closeRecorder{Reader: strings.NewReader("")}
	errOut := &closeRecorder{Reader: strings.NewReader("")}
	sio := stdio.Stdio{Stdout: "bogus://x", Stderr: "bogus://x"}
	_, err := attachIO(context.Background(), sio, Streams{Stdout: out, Stderr: errOut}, ioOwner{id: "t1", namespace: "test"})
	if err == nil {
		t.Fatal("attachIO with an unsupported stdio scheme succeeded")
	}
	if !out.isClosed() || !errOut.isClosed() {
		t.Fatalf("guest stdout closed %v, stderr closed %v; want both closed", out.isClosed(), errOut.isClosed())
	}
}

// TestWaitOutputEndsWithContext waits for output that never ends with a
// context that has: the wait must not last the drain timeout.
func TestWaitOutputEndsWithContext(t *testing.T) {
	pio := &processIO{}
	pio.outputs.Add(1)
	t.Cleanup(pio.outputs.Done)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	returned := make(chan struct{})
	go func() { pio.waitOutput(ctx); close(returned) }()
	select {
	case <-returned:
	case <-time.After(outputDrainTimeout / 2):
		t.Fatal("waitOutput kept waiting after its context ended")
	}
}
