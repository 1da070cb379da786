package snapshotter

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// BenchmarkPrepareCached measures a container Prepare + Remove whose flat
// file already exists. chain: a 2-link chain of a 16 MiB guest (a hard
// link, a state-file copy, chain.json, two metadata transactions).
// ordinary: the 3-layer test image (upper and work dirs, a hard link of the
// rootfs image, rootfs.json, the same transactions).
func BenchmarkPrepareCached(b *testing.B) {
	log.L.Logger.SetLevel(logrus.WarnLevel)
	ctx := context.Background()
	for _, kind := range []string{"chain", "ordinary"} {
		b.Run(kind, func(b *testing.B) {
			sn := newSnapshotter(b, b.TempDir())
			var top string
			if kind == "chain" {
				top = importChain(b, sn, makeChain(b, b.TempDir(), 70, 4096, 2), "layer")
			} else {
				requireOrdinary(b)
				top = importLayers(b, sn, testLayers(b), "layer")
			}
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
		})
	}
}

// BenchmarkBuildRootfsImage measures building the erofs image of a layer
// chain holding size bytes of file data (1 MiB files): from the one
// layer's dir, and from a read-only overlay of three layers.
func BenchmarkBuildRootfsImage(b *testing.B) {
	requireOrdinary(b)
	log.L.Logger.SetLevel(logrus.WarnLevel)
	ctx := context.Background()
	for _, size := range []int{10 << 20, 100 << 20} {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%dMiB/%dlayers", size>>20, n), func(b *testing.B) {
				root := b.TempDir()
				layers := make([]string, n)
				for i := range layers {
					layers[i] = filepath.Join(root, "snapshots", fmt.Sprint(n-i))
					writeFiles(b, layers[i], fmt.Sprintf("layer%d", i), size/n)
				}
				for _, d := range []string{"mnt", "flat"} {
					if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
						b.Fatal(err)
					}
				}
				builder := imageBuilder{mntDir: filepath.Join(root, "mnt"), layerDir: filepath.Join(root, "snapshots"), options: overlayOptions(root)}
				out := filepath.Join(root, "flat", "image")
				b.SetBytes(int64(size))
				b.ResetTimer()
				for b.Loop() {
					if err := builder.build(ctx, layers, out); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := os.Remove(out); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// writeFiles fills dir/sub with size bytes of random data in 1 MiB files.
func writeFiles(b *testing.B, dir, sub string, size int) {
	b.Helper()
	if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := 0; size > 0; i++ {
		chunk := min(size, len(buf))
		rand.Read(buf[:chunk])
		if err := os.WriteFile(filepath.Join(dir, sub, fmt.Sprint("f", i)), buf[:chunk], 0o644); err != nil {
			b.Fatal(err)
		}
		size -= chunk
	}
}
