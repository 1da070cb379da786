package vmmapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// seen is one request as the server got it.
type seen struct {
	method, path, contentType, body string
}

// serve answers every request on a unix socket with status and answer, and
// passes each request on to got.
func serve(t *testing.T, status int, answer string) (sock string, got <-chan seen) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan seen, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- seen{r.Method, r.URL.Path, r.Header.Get("Content-Type"), string(b)}
		w.WriteHeader(status)
		io.WriteString(w, answer)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock, ch
}

func TestDo(t *testing.T) {
	long := strings.Repeat("x", 2*maxErrorBody)
	tests := []struct {
		name   string
		status int
		answer string
		body   any
		want   seen
		err    *StatusError
	}{
		{"json body", 204, "", map[string]string{"state": "Paused"}, seen{"PATCH", "/api/v1/vm", "application/json", `{"state":"Paused"}`}, nil},
		{"no body", 200, "ok", nil, seen{"PATCH", "/api/v1/vm", "", ""}, nil},
		{"refused", 400, "bad request\n", nil, seen{"PATCH", "/api/v1/vm", "", ""}, &StatusError{Status: 400, Body: []byte("bad request\n")}},
		{"long answer cut", 500, long, nil, seen{"PATCH", "/api/v1/vm", "", ""}, &StatusError{Status: 500, Body: []byte(long[:maxErrorBody])}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock, got := serve(t, tt.status, tt.answer)
			err := New(sock, "http://localhost/api/v1/").Do(context.Background(), "PATCH", "vm", tt.body)
			if r := <-got; r != tt.want {
				t.Errorf("server saw %+v, want %+v", r, tt.want)
			}
			var se *StatusError
			switch {
			case tt.err == nil && err != nil:
				t.Errorf("err = %v, want nil", err)
			case tt.err != nil && (!errors.As(err, &se) || se.Status != tt.err.Status || string(se.Body) != string(tt.err.Body)):
				t.Errorf("err = %v, want %v", err, tt.err)
			}
		})
	}
}

func TestDoTransportErrors(t *testing.T) {
	missing := New(filepath.Join(t.TempDir(), "none.sock"), "http://localhost/")
	err := missing.Do(context.Background(), "PUT", "actions", nil)
	if !errors.Is(err, syscall.ENOENT) || errors.As(err, new(*url.Error)) {
		t.Errorf("missing socket: err = %v, want ENOENT without the URL wrapping", err)
	}
	sock := filepath.Join(t.TempDir(), "mute.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := New(sock, "http://localhost/").Do(ctx, "PUT", "actions", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("mute server: err = %v, want deadline exceeded", err)
	}
	if err := New(sock, "http://localhost/").Do(ctx, "PUT", "actions", func() {}); err == nil || !strings.Contains(err.Error(), "encode request") {
		t.Errorf("unencodable body: err = %v", err)
	}
}

func TestGet(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		answer  string
		want    int
		wantErr string
	}{
		{"decoded", 200, `{"n":7}`, 7, ""},
		{"refused", 404, "no such thing", 0, "status 404: no such thing"},
		{"not json", 200, "{", 0, "decode response"},
		{"too large", 200, `{"n":7,"pad":"` + strings.Repeat("x", maxResponse) + `"}`, 0, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock, got := serve(t, tt.status, tt.answer)
			var out struct{ N int }
			err := New(sock, "http://localhost/").Get(context.Background(), "vm/config", &out)
			if r := <-got; r.method != "GET" || r.path != "/vm/config" {
				t.Errorf("server saw %+v", r)
			}
			if tt.wantErr == "" {
				if err != nil || out.N != tt.want {
					t.Fatalf("Get = %+v, %v", out, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Get error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
