package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkRunEcho is `ctr run --rm ... echo hi` end to end: restore the
// VM from the snapshot image, run the process, print, exit, delete.
func BenchmarkRunEcho(b *testing.B) {
	c := stack(b, "")
	b.ResetTimer()
	for i := range b.N {
		out, err := run(c, []string{"--rm"}, fmt.Sprintf("b%d", i), "echo", "hi")
		if err != nil || strings.TrimSpace(out) != "hi" {
			b.Fatalf("ctr run: %q, %v", out, err)
		}
	}
}
