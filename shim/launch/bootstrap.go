package launch

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of containerd's runtime/bootstrap/v1 messages, decoded and
// encoded with protowire alone: the generated types would pull the
// protobuf runtime's registry into the launcher, and its start-up with it.
const (
	paramInstanceID           = 1
	paramNamespace            = 2
	paramLogLevel             = 3
	paramContainerdGRPC       = 6
	paramSocketDir            = 9
	resultVersion             = 1
	resultAddress             = 2
	resultProtocol            = 3
	logLevelDebug       int64 = -4 // LOG_LEVEL_DEBUG; lower is more verbose
)

// Params are the bootstrap parameters containerd writes to `start`'s stdin,
// the fields the launcher uses.
type Params struct {
	InstanceID     string
	Namespace      string
	LogLevel       int64
	ContainerdGRPC string
	SocketDir      string
}

// Debug reports whether containerd logs at debug level or finer.
func (p Params) Debug() bool { return p.LogLevel <= logLevelDebug }

// DecodeParams decodes a BootstrapParams message, skipping fields it does
// not use.
func DecodeParams(b []byte) (Params, error) {
	var p Params
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return p, fmt.Errorf("decode bootstrap params: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case typ == protowire.BytesType && isStringParam(num):
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return p, fmt.Errorf("decode bootstrap params field %d: %w", num, protowire.ParseError(n))
			}
			p.setString(num, v)
			b = b[n:]
		case typ == protowire.VarintType && num == paramLogLevel:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return p, fmt.Errorf("decode bootstrap params log level: %w", protowire.ParseError(n))
			}
			p.LogLevel = int64(int32(v))
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return p, fmt.Errorf("decode bootstrap params field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if p.InstanceID == "" || p.Namespace == "" {
		return p, errors.New("decode bootstrap params: no instance id or namespace")
	}
	return p, nil
}

func isStringParam(num protowire.Number) bool {
	switch num {
	case paramInstanceID, paramNamespace, paramContainerdGRPC, paramSocketDir:
		return true
	}
	return false
}

func (p *Params) setString(num protowire.Number, v string) {
	switch num {
	case paramInstanceID:
		p.InstanceID = v
	case paramNamespace:
		p.Namespace = v
	case paramContainerdGRPC:
		p.ContainerdGRPC = v
	case paramSocketDir:
		p.SocketDir = v
	}
}

// EncodeResult encodes the BootstrapResult `start` prints: shim API version
// 3 over ttrpc at address.
func EncodeResult(address string) []byte {
	b := protowire.AppendTag(nil, resultVersion, protowire.VarintType)
	b = protowire.AppendVarint(b, 3)
	b = protowire.AppendTag(b, resultAddress, protowire.BytesType)
	b = protowire.AppendString(b, address)
	b = protowire.AppendTag(b, resultProtocol, protowire.BytesType)
	return protowire.AppendString(b, "ttrpc")
}
