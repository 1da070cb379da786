package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmapi"
)

// apiBase is the path prefix of every endpoint (the spec's server URL).
const apiBase = "http://localhost/api/v1/"

// apiClient speaks Cloud Hypervisor's REST API on its unix socket.
type apiClient struct {
	rest *vmmapi.Client
}

func newAPIClient(sock string) *apiClient {
	return &apiClient{rest: vmmapi.New(sock, apiBase)}
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
	err := c.rest.Do(ctx, http.MethodPut, op, body)
	var status *vmmapi.StatusError
	switch {
	case errors.As(err, &status):
		return &APIError{Op: op, Status: status.Status, Body: strings.TrimSpace(string(status.Body))}
	case err != nil:
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
