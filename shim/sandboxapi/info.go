package sandboxapi

import (
	"encoding/json"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// verboseInfo is the part of the "info" CRI's verbose PodSandboxStatus
// shows (crictl inspectp) that the shim knows, under the names containerd's
// podsandbox sandboxer gives them.
type verboseInfo struct {
	Pid         uint32                    `json:"pid"`
	Status      string                    `json:"processStatus"`
	Config      *runtime.PodSandboxConfig `json:"config"`
	RuntimeSpec *specs.Spec               `json:"runtimeSpec"`
}

// info is SandboxStatus's verbose info for st.
func (sb *sandbox) info(st status) (map[string]string, error) {
	process := "stopped"
	if st.state == stateReady {
		process = "running"
	}
	data, err := json.Marshal(verboseInfo{Pid: st.pid, Status: process, Config: sb.config, RuntimeSpec: sb.spec})
	if err != nil {
		return nil, fmt.Errorf("encode the info of sandbox %s: %w", sb.id, err)
	}
	return map[string]string{"info": string(data)}, nil
}
