package snapshotter

import (
	"context"
	"testing"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// BenchmarkPrepareCached measures a container Prepare + Remove on a chain
// whose flat file already exists: a hard link, a state-file copy, chain.json
// and two metadata transactions.
func BenchmarkPrepareCached(b *testing.B) {
	log.L.Logger.SetLevel(logrus.WarnLevel)
	ctx := context.Background()
	fx := makeChain(b, b.TempDir(), 70, 4096, 2) // 16 MiB guest, 2 links
	sn := newSnapshotter(b, b.TempDir())
	top := importChain(b, sn, fx, "layer")
	if _, err := sn.Prepare(ctx, "warm", top); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := sn.Prepare(ctx, "ctr", top); err != nil {
			b.Fatal(err)
		}
		if err := sn.Remove(ctx, "ctr"); err != nil {
			b.Fatal(err)
		}
	}
}
