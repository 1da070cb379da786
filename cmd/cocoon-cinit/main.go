// Command cocoon-cinit is the container init of a pod's VM: the agent
// starts it in a container's new namespaces to build the container and
// exec its process, and again to run an exec in it (see agent/cinit).
package main

import "github.com/cocoonstack/containerd-shim-cocoon/agent/cinit"

func main() { cinit.Main() }
