package cpuload

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestBusy: a share between 0 and 1, and a busy loop on every CPU reads
// as busier than the machine at rest would ever need to be to pass.
func TestBusy(t *testing.T) {
	if b := Busy(50 * time.Millisecond); b < 0 || b > 1 {
		t.Fatalf("Busy = %v, want a share in [0, 1]", b)
	}
	var stop atomic.Bool
	defer stop.Store(true)
	for range 4 {
		go func() {
			for !stop.Load() {
			}
		}()
	}
	if b := Busy(200 * time.Millisecond); b < 0.5 {
		t.Errorf("Busy with busy loops = %v, want at least 0.5", b)
	}
}
