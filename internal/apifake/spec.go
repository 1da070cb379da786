// Package apifake serves fake hypervisor REST APIs for tests.
//
// Every request is checked against the hypervisor's published API
// description (shared/specs): unknown paths and methods, and bodies that
// break the schema (missing required fields, wrong types, values outside an
// enum) are rejected before a fake's state machine sees them. Accepted and
// rejected requests alike are recorded so tests can assert exactly what a
// driver sent.
package apifake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// Spec is a loaded API description that validates requests.
type Spec struct {
	doc    *openapi3.T
	router routers.Router
	// Base is the path prefix of every operation ("/api/v1" for Cloud
	// Hypervisor, "" for Firecracker).
	Base string
}

// LoadSpec reads an OpenAPI 3 or Swagger 2 YAML file.
func LoadSpec(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	doc, err := parseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("parse spec %s: %w", path, err)
	}
	base, err := pathOnlyServers(doc)
	if err != nil {
		return nil, fmt.Errorf("spec %s: %w", path, err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route spec %s: %w", path, err)
	}
	return &Spec{doc: doc, router: router, Base: base}, nil
}

func parseSpec(data []byte) (*openapi3.T, error) {
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("swagger:")) {
		var doc2 openapi2.T
		if err := openapi2.UnmarshalFromData(data, &doc2); err != nil {
			return nil, err
		}
		return openapi2conv.ToV3(&doc2)
	}
	return openapi3.NewLoader().LoadFromData(data)
}

// pathOnlyServers drops scheme and host from the servers: a unix-socket API
// answers whatever Host a client sends, only the path prefix matters.
func pathOnlyServers(doc *openapi3.T) (string, error) {
	if len(doc.Servers) == 0 {
		doc.Servers = openapi3.Servers{{URL: "/"}}
	}
	for _, s := range doc.Servers {
		u, err := url.Parse(s.URL)
		if err != nil {
			return "", fmt.Errorf("server url %q: %w", s.URL, err)
		}
		s.URL = u.Path
	}
	return strings.TrimSuffix(doc.Servers[0].URL, "/"), nil
}

// Validate checks r (whose body is body) against the spec. It returns the
// HTTP status to answer with when the request is off-spec: 404 for an
// unknown path, 405 for a method the path lacks, 400 for a bad body.
func (s *Spec) Validate(ctx context.Context, r *http.Request, body []byte) (int, error) {
	route, params, err := s.router.FindRoute(r)
	if err != nil {
		var rerr *routers.RouteError
		if errors.As(err, &rerr) && errors.Is(rerr, routers.ErrMethodNotAllowed) {
			return http.StatusMethodNotAllowed, err
		}
		return http.StatusNotFound, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: params,
		Route:      route,
		Options:    &openapi3filter.Options{MultiError: true},
	}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
		return http.StatusBadRequest, err
	}
	return 0, nil
}

// ValidateJSON checks the JSON document data against the spec's schema
// name (a components schema, e.g. "VmConfig"). Null fields are taken as
// absent first, as the VMMs' decoders take them for optional fields, which
// the specs do not mark nullable.
func (s *Spec) ValidateJSON(name string, data []byte) error {
	ref := s.doc.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("the spec has no schema %s", name)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("parse %s: %w", name, err)
	}
	if err := ref.Value.VisitJSON(dropNulls(v), openapi3.MultiErrors()); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func dropNulls(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if e == nil {
				delete(v, k)
			} else {
				v[k] = dropNulls(e)
			}
		}
	case []any:
		for i, e := range v {
			v[i] = dropNulls(e)
		}
	}
	return v
}

// HasProperty reports whether the spec's schema names prop: the Cloud
// Hypervisor fork's VmSnapshotConfig has snapshot_type, upstream's has not.
func (s *Spec) HasProperty(schema, prop string) bool {
	ref, ok := s.doc.Components.Schemas[schema]
	if !ok || ref.Value == nil {
		return false
	}
	_, ok = ref.Value.Properties[prop]
	return ok
}
