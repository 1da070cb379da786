// Command pause is the test pause image's process: it holds a pod's
// namespaces, reaps the children re-parented to it (it is the pod's PID 1
// when the pod shares a PID namespace) and exits 0 on SIGINT or SIGTERM,
// as the guest's own pause does (agent/pause). Built static
// (CGO_ENABLED=0) by testimage.Pause.
package main

import "github.com/cocoonstack/containerd-shim-cocoon/agent/pause"

func main() { pause.Main() }
