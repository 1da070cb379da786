package agent_test

import (
	"os"
	"testing"

	"github.com/cocoonstack/containerd-shim-cocoon/agent/server"
)

func TestMain(m *testing.M) {
	server.ExecHelper() // the in-process agent starts processes through it
	os.Exit(m.Run())
}
