package task

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"

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
	_, err := attachIO(context.Background(), sio, guestStreams{stdout: out, stderr: errOut}, ioOwner{id: "t1", namespace: "test"})
	if err == nil {
		t.Fatal("attachIO with an unsupported stdio scheme succeeded")
	}
	if !out.isClosed() || !errOut.isClosed() {
		t.Fatalf("guest stdout closed %v, stderr closed %v; want both closed", out.isClosed(), errOut.isClosed())
	}
}
