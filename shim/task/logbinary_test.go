package task

import (
	"os"
	"path/filepath"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
)

// loggerScript is a logging binary: it records who it logs for, signals
// ready by closing fd 5, then copies fd 3 (stdout) and fd 4 (stderr) to
// files named by its "out" argument.
const loggerScript = `#!/bin/sh
out=$2
echo "$CONTAINER_NAMESPACE/$CONTAINER_ID" > "$out.id"
exec 5>&-
cat <&4 > "$out.err" &
cat <&3 > "$out"
wait
`

func TestBinaryLogger(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "logger.sh")
	if err := os.WriteFile(script, []byte(loggerScript), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "log")
	uri := "binary://" + script + "?out=" + out
	req := &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("echo", "logged")), Rootfs: h.rootfs(), Stdout: uri, Stderr: uri}
	if _, err := h.svc.Create(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	h.start("t1", "")
	if code := h.wait("t1", ""); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	for file, want := range map[string]string{out: "logged\n", out + ".id": "test/t1\n"} {
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("%s holds %q, want %q", filepath.Base(file), got, want)
		}
	}
}

func TestBinaryLoggerNotReady(t *testing.T) {
	h := newHarness(t)
	uri := "binary-v2:///bin/true"
	req := &taskAPI.CreateTaskRequest{ID: "t1", Bundle: h.bundle(specFor("echo", "x")), Rootfs: h.rootfs(), Stdout: uri, Stderr: uri}
	if _, err := h.svc.Create(h.ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Start(h.ctx, &taskAPI.StartRequest{ID: "t1"}); err == nil {
		t.Fatal("Start with a binary-v2 logger that never signals ready succeeded")
	}
}
