package api

// Bounds of an InitRequest, checked by the host before sending and by the
// guest on receipt; the whole request stays well under ttrpc's 4 MiB limit.
const (
	// MaxFiles bounds InitRequest.files: files, directories and links (a
	// Kubernetes volume takes two per key, its file and the key's link).
	MaxFiles = 128
	// MaxFileSize bounds one File's data.
	MaxFileSize = 256 << 10
	// MaxFilesSize bounds the data of all files together.
	MaxFilesSize = 1 << 20
	// MaxPiecedFile bounds a file UpdateFiles takes in pieces (File.offset
	// and File.more), each piece at most MaxFileSize.
	MaxPiecedFile = 1 << 30
)

// MaxContainerSpec bounds a container's OCI spec, an exec's OCI process and
// a resources update, as JSON: a spec is a few KiB, its seccomp profile
// some tens.
const MaxContainerSpec = 1 << 20

// Bounds of InitRequest.sysctls: a pod sets a handful.
const (
	MaxSysctls     = 64
	MaxSysctlKey   = 256
	MaxSysctlValue = 4096
)

// Bounds of the port calls: the connections open in a guest at once, and
// the bytes of one ReadPort reply or WritePort request. A chunk this large
// pays a call's round trip once for many of the peer's writes.
const (
	MaxPortConns = 256
	MaxPortChunk = 1 << 20
)

// Bounds of the share calls: the shares a guest mounts at once, the bytes
// of one FUSE message (the host's file system negotiates writes of at most
// MaxShareWrite), and the bytes one ReadShare or WriteShare carries.
const (
	MaxShares     = 64
	MaxShareWrite = 128 << 10
	MaxShareMsg   = MaxShareWrite + 4<<10
	MaxShareBatch = 1 << 20
)
