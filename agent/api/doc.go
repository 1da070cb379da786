// Package api is the generated protobuf and ttrpc code of the guest agent's
// API, defined in agent.proto.
package api

//go:generate ./generate.sh
