package chain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/opencontainers/go-digest"
)

// VerifyData checks that dir's memory.data has the size and the sha256
// digest link.json records for it. Validate leaves this out to stay cheap;
// VerifyData reads every data byte once, which costs little right after
// the link was written or unpacked, while the bytes are in the page cache.
func VerifyData(ctx context.Context, dir string, l *Link) error {
	path := filepath.Join(dir, DataFile)
	f, err := OpenLinkFile(path, l.MemoryBytes)
	if err != nil {
		return fmt.Errorf("verify memory data: %w", err)
	}
	defer f.Close()
	h := digest.SHA256.Hash()
	buf := make([]byte, ioChunk)
	var size int64
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("verify %s: %w", path, err)
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		size += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
	if size != l.Memory.DataBytes {
		return fmt.Errorf("%s: %d bytes, %s says %d", path, size, LinkFile, l.Memory.DataBytes)
	}
	if got := digest.NewDigest(digest.SHA256, h); got != l.Memory.DataDigest {
		return fmt.Errorf("%s: digest mismatch: content is %s, %s says %s", path, got, LinkFile, l.Memory.DataDigest)
	}
	return nil
}
