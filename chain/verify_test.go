package chain

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestVerifyData(t *testing.T) {
	template := t.TempDir()
	buildChain(t, template, 64)
	tests := []struct {
		name    string
		corrupt func(t *testing.T, dirs []string)
		want    string // empty: the data is intact
	}{
		{"intact", func(*testing.T, []string) {}, ""},
		{"one byte flipped", flipDataByte(1), "digest mismatch"},
		{"one page short", truncateData(1, -testPage), "bytes, link.json says"},
		{"one page long", truncateData(1, testPage), "bytes, link.json says"},
		{"missing", removeFile(1, DataFile), DataFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dirs := copyChain(t, template, t.TempDir())
			l, err := ReadLink(dirs[1])
			if err != nil {
				t.Fatal(err)
			}
			tt.corrupt(t, dirs)
			err = VerifyData(context.Background(), dirs[1], l)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("verify intact data: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("verify corrupt data: %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestVerifyDataStopsOnCancel(t *testing.T) {
	dirs := buildChain(t, t.TempDir(), 64).dirs
	l, err := ReadLink(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := VerifyData(ctx, dirs[0], l); !errors.Is(err, context.Canceled) {
		t.Fatalf("verify with a cancelled context: %v, want context.Canceled", err)
	}
}
