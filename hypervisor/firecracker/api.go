package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmapi"
)

// apiBase is the API's root (the spec's basePath).
const apiBase = "http://localhost/"

// apiClient speaks Firecracker's REST API on its unix socket.
type apiClient struct {
	rest *vmmapi.Client
}

func newAPIClient(sock string) *apiClient {
	return &apiClient{rest: vmmapi.New(sock, apiBase)}
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
	return apiError(method, path, c.rest.Do(ctx, method, path, body))
}

// get sends GET path and decodes the 2xx answer into out.
func (c *apiClient) get(ctx context.Context, path string, out any) error {
	return apiError("GET", path, c.rest.Get(ctx, path, out))
}

// apiError names the request in err, an *APIError for a non-2xx answer.
func apiError(method, path string, err error) error {
	var status *vmmapi.StatusError
	switch {
	case errors.As(err, &status):
		return &APIError{Method: method, Path: path, Status: status.Status, Fault: faultMessage(status.Body)}
	case err != nil:
		return fmt.Errorf("%s /%s: %w", method, path, err)
	}
	return nil
}

// faultMessage is the fault_message of an Error body, or the body itself
// when it is not one.
func faultMessage(body []byte) string {
	var fault struct {
		FaultMessage string `json:"fault_message"`
	}
	if json.Unmarshal(body, &fault) != nil || fault.FaultMessage == "" {
		return strings.TrimSpace(string(body))
	}
	return fault.FaultMessage
}
