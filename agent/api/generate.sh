#!/bin/sh
# Regenerates agent.pb.go and agent_ttrpc.pb.go with Debian's protoc and the
# Go plugins at the versions go.mod pins, run from the module proxy.
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

plugin() { # plugin NAME MODULE PACKAGE
	version=$(go list -m -f '{{.Version}}' "$2")
	printf '#!/bin/sh\nexec go run %s@%s "$@"\n' "$3" "$version" >"$tmp/$1"
	chmod +x "$tmp/$1"
}
plugin protoc-gen-go google.golang.org/protobuf google.golang.org/protobuf/cmd/protoc-gen-go
plugin protoc-gen-go-ttrpc github.com/containerd/ttrpc github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc

protoc -I . -I /usr/include \
	--plugin=protoc-gen-go="$tmp/protoc-gen-go" --go_out=paths=source_relative:. \
	--plugin=protoc-gen-go-ttrpc="$tmp/protoc-gen-go-ttrpc" --go-ttrpc_out=paths=source_relative:. \
	agent.proto
