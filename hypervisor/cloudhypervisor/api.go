package cloudhypervisor

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

// apiBase is the path prefix of every endpoint (the spec's server URL).
const apiBase = "http://localhost/api/v1/"

// maxErrorBody bounds how much of an error response is quoted.
const maxErrorBody = 4096

// apiClient speaks Cloud Hypervisor's REST API on its unix socket.
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
	Op     string
	Status int
	Body   string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s: status %d: %s", e.Op, e.Status, e.Body)
}

// put sends PUT op with body (nil: no body) and expects a 2xx answer.
func (c *apiClient) put(ctx context.Context, op string, body any) error {
	ctx, cancel := vmmproc.WithDefaultTimeout(ctx, callTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, apiBase+op, rd)
	if err != nil {
		return fmt.Errorf("build %s request: %w", op, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", op, transportError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return &APIError{Op: op, Status: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
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
