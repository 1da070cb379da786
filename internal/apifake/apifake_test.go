package apifake

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serve starts model behind the named spec on a unix socket and returns a
// function sending one request and returning the status.
func serveModel(t *testing.T, specName string, model Model) (*Server, func(method, op, body string) int) {
	t.Helper()
	spec, err := LoadSpec(SpecPath(t, specName))
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(spec, model, nil)
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := srv.ServeUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	t.Cleanup(client.CloseIdleConnections)
	return srv, func(method, op, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, "http://localhost"+spec.Base+"/"+op, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
}

type step struct {
	method, op, body string
	want             int
}

func runSteps(t *testing.T, do func(method, op, body string) int, steps []step) {
	t.Helper()
	for i, s := range steps {
		if got := do(s.method, s.op, s.body); got != s.want {
			t.Errorf("step %d: %s %s %s = %d, want %d", i, s.method, s.op, s.body, got, s.want)
		}
	}
}

// snapshotDir writes a Cloud Hypervisor snapshot directory.
func snapshotDir(t *testing.T, vsock string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		CHConfigFile: `{"vsock":{"cid":3,"socket":"` + vsock + `"},"future_field":{"x":1}}`,
		CHStateFile:  `{"snapshot_data":{}}`,
		CHMemoryFile: "guest memory",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestOffSpecRequestsRejected(t *testing.T) {
	tests := []struct {
		name, spec string
		model      Model
		step
	}{
		{"ch missing source_url", SpecCH, &CH{}, step{"PUT", "vm.restore", `{"prefault":true}`, 400}},
		{"ch wrong type", SpecCH, &CH{}, step{"PUT", "vm.restore", `{"source_url":5}`, 400}},
		{"ch CopyOnWrite upstream", SpecCH, &CH{}, step{"PUT", "vm.restore", `{"source_url":"file:///x","memory_restore_mode":"CopyOnWrite"}`, 400}},
		{"ch bad snapshot_type", SpecCHFork, &CH{}, step{"PUT", "vm.snapshot", `{"destination_url":"file:///x","snapshot_type":"incremental"}`, 400}},
		{"ch no body", SpecCH, &CH{}, step{"PUT", "vm.restore", ``, 400}},
		{"ch unknown path", SpecCH, &CH{}, step{"PUT", "vm.teleport", ``, 404}},
		{"ch wrong method", SpecCH, &CH{}, step{"GET", "vm.restore", ``, 405}},
		{"fc bad backend", SpecFC, &FC{}, step{"PUT", "snapshot/load", `{"snapshot_path":"s","mem_backend":{"backend_type":"Memfd","backend_path":"m"}}`, 400}},
		{"fc backend without path", SpecFC, &FC{}, step{"PUT", "snapshot/load", `{"snapshot_path":"s","mem_backend":{"backend_type":"File"}}`, 400}},
		{"fc bad vm state", SpecFC, &FC{}, step{"PATCH", "vm", `{"state":"Stopped"}`, 400}},
		{"fc missing vm state", SpecFC, &FC{}, step{"PATCH", "vm", `{}`, 400}},
		{"fc bad snapshot type", SpecFC, &FC{}, step{"PUT", "snapshot/create", `{"mem_file_path":"m","snapshot_path":"s","snapshot_type":"full"}`, 400}},
		{"fc wrong method", SpecFC, &FC{}, step{"PUT", "vm", `{"state":"Paused"}`, 405}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, do := serveModel(t, tt.spec, tt.model)
			runSteps(t, do, []step{tt.step})
			reqs := srv.Requests()
			if len(reqs) != 1 || reqs[0].Error == "" {
				t.Errorf("recorded %+v, want one request with a validation error", reqs)
			}
		})
	}
}

func TestCHStateMachine(t *testing.T) {
	src := snapshotDir(t, filepath.Join(t.TempDir(), "vsock.sock"))
	dst := t.TempDir()
	restore := `{"source_url":"file://` + src + `","memory_restore_mode":"CopyOnWrite"}`
	_, do := serveModel(t, SpecCHFork, &CH{})
	runSteps(t, do, []step{
		{"PUT", "vm.pause", "", 404},
		{"PUT", "vm.resume", "", 404},
		{"PUT", "vm.snapshot", `{"destination_url":"file://` + dst + `"}`, 404},
		{"PUT", "vm.restore", `{"source_url":"file:///nonexistent"}`, 500},
		{"PUT", "vm.restore", restore, 204},
		{"PUT", "vm.restore", restore, 404},
		{"PUT", "vm.pause", "", 405},
		{"PUT", "vm.resume", "", 204},
		{"PUT", "vm.resume", "", 405},
		{"PUT", "vm.snapshot", `{"destination_url":"file://` + dst + `"}`, 405},
		{"PUT", "vm.pause", "", 204},
		{"PUT", "vm.snapshot", `{"destination_url":"file://` + dst + `","snapshot_type":"full"}`, 204},
		{"PUT", "vm.shutdown", "", 204},
		{"PUT", "vm.resume", "", 405},
	})
	for _, name := range []string{CHConfigFile, CHStateFile, CHMemoryFile} {
		want, _ := os.ReadFile(filepath.Join(src, name))
		if got, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(got) != string(want) {
			t.Errorf("snapshot %s = %q, %v; want %q", name, got, err, want)
		}
	}
}

func TestFCStateMachine(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"vmstate", "memory"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	exited := make(chan struct{})
	_, do := serveModel(t, SpecFC, &FC{Exit: func() { close(exited) }})
	load := `{"snapshot_path":"` + dir + `/vmstate","mem_backend":{"backend_type":"File","backend_path":"` + dir + `/memory"},"vsock_override":{"uds_path":"` + dir + `/v.sock"}}`
	create := func(kind string) string {
		return `{"mem_file_path":"` + dir + `/out-mem-` + kind + `","snapshot_path":"` + dir + `/out-state-` + kind + `","snapshot_type":"` + kind + `"}`
	}
	runSteps(t, do, []step{
		{"PATCH", "vm", `{"state":"Resumed"}`, 400},
		{"PUT", "snapshot/create", create("Full"), 400},
		{"PUT", "snapshot/load", `{"snapshot_path":"` + dir + `/vmstate"}`, 400},
		{"PUT", "snapshot/load", load, 204},
		{"PUT", "snapshot/load", load, 400},
		{"PATCH", "vm", `{"state":"Paused"}`, 400},
		{"PUT", "actions", `{"action_type":"SendCtrlAltDel"}`, 400},
		{"PUT", "snapshot/create", create("Full"), 204},
		{"PUT", "snapshot/create", create("Diff"), 400},
		{"PATCH", "vm", `{"state":"Resumed"}`, 204},
		{"PUT", "snapshot/create", create("Full"), 400},
		{"PUT", "actions", `{"action_type":"SendCtrlAltDel"}`, 204},
	})
	<-exited
	if got, err := os.ReadFile(filepath.Join(dir, "out-mem-Full")); err != nil || string(got) != "memory" {
		t.Errorf("snapshot memory = %q, %v", got, err)
	}
}

func TestHybridVsock(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "v.sock")
	ln, err := ServeHybridVsock(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "CONNECT 1024\nping\n"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"OK 1073741824\n", "ping\n"} {
		if got, err := br.ReadString('\n'); err != nil || got != want {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
	}
}

// TestCHOpensDisks: a fake Cloud Hypervisor opens its disks on restore as
// the real one does: an image shorter than a block fails, a type other
// than the one detected fails, and a writable image is locked against a
// second VM while read-only ones share.
func TestCHOpensDisks(t *testing.T) {
	// Each case its own images: an in-process fake keeps them open, and
	// locked, until the test binary exits.
	images := func(t *testing.T) string {
		dir := t.TempDir()
		for name, data := range map[string][]byte{"raw": make([]byte, diskBlock), "short": make([]byte, 512),
			"qcow": append([]byte("QFI\xfb"), make([]byte, diskBlock)...)} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	restoreWith := func(t *testing.T, disk string) int {
		src := snapshotDir(t, filepath.Join(t.TempDir(), "vsock.sock"))
		cfg := `{"vsock":{"cid":3,"socket":"` + filepath.Join(t.TempDir(), "v.sock") + `"},"disks":[` + disk + `]}`
		if err := os.WriteFile(filepath.Join(src, CHConfigFile), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		_, do := serveModel(t, SpecCH, &CH{})
		return do("PUT", "vm.restore", `{"source_url":"file://`+src+`"}`)
	}
	type disk struct {
		name      string
		readonly  bool
		imageType string
	}
	tests := []struct {
		name  string
		disks []disk
		want  []int
	}{
		{"read-only images share", []disk{{"raw", true, "Raw"}, {"raw", true, "Raw"}}, []int{204, 204}},
		{"a writable image is locked", []disk{{"raw", false, "Raw"}, {"raw", true, "Raw"}}, []int{204, 500}},
		{"shorter than a block", []disk{{"short", true, "Raw"}}, []int{500}},
		{"qcow2 given as raw", []disk{{"qcow", true, "Raw"}}, []int{500}},
		{"qcow2 detected", []disk{{"qcow", true, "Unknown"}}, []int{204}},
		{"missing", []disk{{"none", true, "Raw"}}, []int{500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := images(t)
			for i, d := range tt.disks {
				cfg := fmt.Sprintf(`{"path":%q,"readonly":%v,"image_type":%q}`, filepath.Join(dir, d.name), d.readonly, d.imageType)
				if got := restoreWith(t, cfg); got != tt.want[i] {
					t.Errorf("restore %d with %s: status %d, want %d", i, cfg, got, tt.want[i])
				}
			}
		})
	}
}
