package apifake

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
)

// Response is a fake's answer to a valid request.
type Response struct {
	Status int
	// Body is encoded as JSON unless it is a string, which is sent as text.
	Body any
	// After, if set, runs once the response has been sent.
	After func()
}

// Model is a fake hypervisor's state machine. Handle sees only requests
// that passed spec validation; op is the path with the spec's base removed
// ("vm.restore", "snapshot/load").
type Model interface {
	Handle(method, op string, body []byte) Response
	// Reject formats an error body in the hypervisor's own style.
	Reject(msg string) any
}

// Request is one recorded request.
type Request struct {
	Method string          `json:"method"`
	Op     string          `json:"op"`
	Body   json.RawMessage `json:"body,omitempty"`
	Status int             `json:"status"`
	Error  string          `json:"error,omitempty"`
}

// Server checks each request against a Spec, hands valid ones to a Model
// and records every request.
type Server struct {
	// Hang names operations ("vm.restore") never answered: the request
	// blocks until the client goes away.
	Hang map[string]bool

	spec   *Spec
	model  Model
	mu     sync.Mutex
	record io.Writer
	log    []Request
}

// NewServer serves model behind spec. If record is not nil every request is
// appended to it as one JSON line.
func NewServer(spec *Spec, model Model, record io.Writer) *Server {
	return &Server{spec: spec, model: model, record: record}
}

// Requests returns the requests served so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// ServeUnix serves on a new unix socket at path until the listener closes.
func (s *Server) ServeUnix(path string) (net.Listener, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on api socket: %w", err)
	}
	go http.Serve(ln, s)
	return ln, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	op := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, s.spec.Base), "/")
	rec := Request{Method: r.Method, Op: op}
	if json.Valid(body) {
		rec.Body = body
	}
	var resp Response
	if status, verr := s.spec.Validate(r.Context(), r, body); verr != nil {
		resp = Response{Status: status, Body: s.model.Reject(verr.Error())}
		rec.Error = verr.Error()
	} else if s.Hang[op] {
		s.remember(rec)
		<-r.Context().Done()
		return
	} else {
		resp = s.model.Handle(r.Method, op, body)
	}
	rec.Status = resp.Status
	s.remember(rec)
	writeResponse(w, resp)
	if resp.After != nil {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		resp.After()
	}
}

func (s *Server) remember(rec Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, rec)
	if s.record != nil {
		line, _ := json.Marshal(rec)
		s.record.Write(append(line, '\n'))
	}
}

func writeResponse(w http.ResponseWriter, resp Response) {
	switch b := resp.Body.(type) {
	case nil:
		w.WriteHeader(resp.Status)
	case string:
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(resp.Status)
		io.WriteString(w, b)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.Status)
		json.NewEncoder(w).Encode(b)
	}
}

// ReadRecord parses a record file written by a Server.
func ReadRecord(path string) ([]Request, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read request record: %w", err)
	}
	var reqs []Request
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var r Request
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("parse request record line %q: %w", line, err)
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}
