package server

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// replyEnvelope is room for what ttrpc wraps a reply in: its Response
// message with the status.
const replyEnvelope = 1 << 10

// maxReply bounds the payload of one reply. ttrpc refuses to send a
// message over its limit by dropping the whole connection, and with it the
// host's session, which the host does not learn of: every later call would
// time out. So a call whose reply would be larger answers
// ResourceExhausted instead, and the session lives on.
var maxReply = (*ttrpc.OversizedMessageErr)(nil).MaximumLength() - replyEnvelope

// maxErrorLen bounds the message of an error reply; the rest is cut.
const maxErrorLen = 16 << 10

// boundReply fails a reply too large to send.
func boundReply(method string, resp any) error {
	m, ok := resp.(proto.Message)
	if !ok {
		return nil
	}
	if n := proto.Size(m); n > maxReply {
		return fmt.Errorf("%s reply of %d bytes exceeds the agent's bound of %d: %w", method, n, maxReply, errdefs.ErrResourceExhausted)
	}
	return nil
}

// sendableError makes a status error's message one ttrpc can send: valid
// UTF-8 (a reply that does not marshal drops the connection, as one too
// large does) and at most maxErrorLen bytes.
func sendableError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := strings.ToValidUTF8(st.Message(), "\uFFFD")
	if len(msg) > maxErrorLen {
		kept := cutUTF8(msg, maxErrorLen)
		msg = fmt.Sprintf("%s... (%d bytes cut)", kept, len(msg)-len(kept))
	}
	if msg == st.Message() {
		return err
	}
	return status.Error(st.Code(), msg)
}

// cutUTF8 cuts s, valid UTF-8, to at most n bytes without splitting a
// character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
