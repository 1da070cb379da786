// Command cocoon-pause is the pause process of a pod's VM (agent/pause),
// a binary of its own so that its start runs little code: under TCG a
// restored guest translates anew every instruction it runs, and the
// agent's binary, which the pause used to be, spent 100–200 ms of the
// guest's CPU on its package inits just as the pod's first container was
// being made.
package main

import "github.com/cocoonstack/containerd-shim-cocoon/agent/pause"

func main() { pause.Main() }
