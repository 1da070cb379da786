package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Annotations that put several tasks into one shim process (each task
// still gets its own VM); see groupOf for the rule.
const (
	// AnnotationSandboxID is set by containerd's CRI plugin on a pod's
	// sandbox and on each of its containers.
	AnnotationSandboxID = "io.kubernetes.cri.sandbox-id"
	// AnnotationGroup groups tasks that are not in a pod (ctr, nerdctl,
	// the containerd client).
	AnnotationGroup = "io.cocoon.group"
)

// groupOf returns the shim group of task id, from the annotations of its
// bundle's OCI spec:
//
//   - a pod's sandbox and containers share one shim, as with runc: the CRI
//     sandbox ID decides, and io.cocoon.group is ignored, so no annotation a
//     pod may carry (runtimes pass pod annotations through) can put its
//     container into another pod's shim;
//   - other tasks with io.cocoon.group share the shim of that group, in a
//     name space of its own ("group:" + name: IDs cannot hold a colon), so a
//     group can be neither a pod nor another task;
//   - any other task has a shim of its own.
func groupOf(id, specPath string) (string, error) {
	data, err := os.ReadFile(specPath)
	if errors.Is(err, os.ErrNotExist) {
		// A sandbox of containerd's sandbox API (sandboxer = "shim") has
		// no spec: its shim is its own, and its containers come to it.
		return id, nil
	}
	if err != nil {
		return "", fmt.Errorf("read bundle spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("decode bundle spec %s: %w", specPath, err)
	}
	if sandbox := spec.Annotations[AnnotationSandboxID]; sandbox != "" {
		return sandbox, nil
	}
	if g := spec.Annotations[AnnotationGroup]; g != "" {
		return "group:" + g, nil
	}
	return id, nil
}
