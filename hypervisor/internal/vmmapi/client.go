// Package vmmapi is a small client for a VMM's REST API on a unix socket
// (Cloud Hypervisor, Firecracker): JSON request bodies, and any answer
// other than 2xx as a *StatusError for the driver to turn into its own
// typed error.
package vmmapi

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
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// callTimeout bounds a call whose context has no deadline of its own: a
// VMM that never answers a request must not hang the caller.
const callTimeout = 2 * time.Minute

// Bounds on how much of a response is read: an error's start, and a whole
// answer Get decodes.
const (
	maxErrorBody = 4096
	maxResponse  = 1 << 20
)

// Client sends requests to the API on one unix socket.
type Client struct {
	http *http.Client
	base string
}

// New returns a client for the API served on sock, whose endpoints are
// paths under base ("http://localhost/api/v1/").
func New(sock, base string) *Client {
	return &Client{base: base, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		// Each VMM serves one client, and a pooled connection to a VMM
		// that has exited only turns into a confusing error later.
		DisableKeepAlives: true,
	}}}
}

// StatusError is an answer other than 2xx.
type StatusError struct {
	Status int
	// Body is the start of the response body, at most 4 KiB.
	Body []byte
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("status %d: %s", e.Status, bytes.TrimSpace(e.Body))
}

// Do sends method to path with body as JSON (nil: no body) and expects a
// 2xx answer; any other answer is a *StatusError. The error does not name
// the request: the caller knows it by its API's name.
func (c *Client) Do(ctx context.Context, method, path string, body any) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Get sends GET path and decodes the 2xx JSON answer, at most 1 MiB, into
// out; errors are as Do's.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return fmt.Errorf("read response: %w", transportError(err))
	}
	if len(b) > maxResponse {
		return fmt.Errorf("response larger than %d bytes", maxResponse)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// send sends the request and returns a 2xx response for the caller to
// read and close; any other answer is a *StatusError.
func (c *Client) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return nil, &StatusError{Status: resp.StatusCode, Body: msg}
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
