package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// apiBase is the API's root (the spec's basePath).
const apiBase = "http://localhost/"

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 4096

// apiClient speaks Firecracker's REST API on its unix socket.
type apiClient struct {
	http *http.Client
}

func newAPIClient(sock string) *apiClient {
	return &apiClient{http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}}
}

// APIError is a response other than success from the API.
type APIError struct {
	Method, Path string
	Status       int
	// Fault is the Error.fault_message of the body, or the raw body.
	Fault string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s /%s: status %d: %s", e.Method, e.Path, e.Status, e.Fault)
}

// call sends method path with body as JSON and expects a 2xx answer.
func (c *apiClient) call(ctx context.Context, method, path string, body any) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, callTimeout)
	defer cancel()
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode %s /%s request: %w", method, path, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, apiBase+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("build %s /%s request: %w", method, path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s /%s: %w", method, path, transportError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var fault struct {
		FaultMessage string `json:"fault_message"`
	}
	if json.Unmarshal(msg, &fault) != nil || fault.FaultMessage == "" {
		fault.FaultMessage = strings.TrimSpace(string(msg))
	}
	return &APIError{Method: method, Path: path, Status: resp.StatusCode, Fault: fault.FaultMessage}
}

// transportError drops the *url.Error wrapping, which only repeats the
// method and the URL of a socket that has but one server.
func transportError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}
