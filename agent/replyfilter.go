package agent

import (
	"encoding/binary"
	"io"
	"math/bits"
	"net"
	"sync"

	"github.com/containerd/log"
)

// The ttrpc message header (containerd/ttrpc PROTOCOL.md): length, stream
// id, type, flags.
const (
	ttrpcHeaderLen    = 10
	ttrpcTypeRequest  = 1
	ttrpcTypeResponse = 2
)

// replyFilter stands between the ttrpc client and the guest. The client
// logs an error line for every message on a stream it does not know, so a
// guest sending replies nobody asked for could flood the host's log. The
// filter passes on only responses to requests the client sent and has not
// had answered (the agent API is unary only), and drops the rest, logging
// the drops at exponentially growing counts.
type replyFilter struct {
	net.Conn

	mu   sync.Mutex
	open map[uint32]struct{} // stream ids sent, not yet answered
	out  headerScanner       // the client's writes

	// The read side, used by the client's one reader.
	hdr     [ttrpcHeaderLen]byte
	hdrLeft int    // bytes of hdr still to hand to the reader
	remain  uint32 // payload bytes of the current message still to pass or skip
	pass    bool
	dropped uint64
}

func newReplyFilter(conn net.Conn) *replyFilter {
	return &replyFilter{Conn: conn, open: map[uint32]struct{}{}}
}

// Write records the requests in p before sending it, so a quick reply
// finds its stream open.
func (f *replyFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	f.out.scan(p, func(h ttrpcHeader) {
		if h.typ == ttrpcTypeRequest {
			f.open[h.stream] = struct{}{}
		}
	})
	f.mu.Unlock()
	return f.Conn.Write(p)
}

func (f *replyFilter) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		switch {
		case f.pass && f.hdrLeft > 0:
			n := copy(p, f.hdr[ttrpcHeaderLen-f.hdrLeft:])
			f.hdrLeft -= n
			return n, nil
		case f.pass && f.remain > 0:
			n, err := f.Conn.Read(p[:min(uint32(len(p)), f.remain)])
			f.remain -= uint32(n)
			return n, err
		case f.remain > 0:
			n, err := io.CopyN(io.Discard, f.Conn, int64(f.remain))
			f.remain -= uint32(n)
			if err != nil {
				return 0, err
			}
		default:
			if _, err := io.ReadFull(f.Conn, f.hdr[:]); err != nil {
				return 0, err
			}
			h := parseTTRPCHeader(f.hdr[:])
			f.remain, f.hdrLeft = h.length, ttrpcHeaderLen
			f.pass = f.admit(h)
		}
	}
}

// admit says whether the message h heads is a reply the client waits for.
func (f *replyFilter) admit(h ttrpcHeader) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.open[h.stream]; ok && h.typ == ttrpcTypeResponse {
		delete(f.open, h.stream)
		return true
	}
	f.dropped++
	if bits.OnesCount64(f.dropped) == 1 {
		log.L.WithFields(log.Fields{
			"stream": h.stream, "type": h.typ, "length": h.length, "dropped": f.dropped,
		}).Warn("dropped guest agent messages that answer no request")
	}
	return false
}

type ttrpcHeader struct {
	length, stream uint32
	typ            byte
}

func parseTTRPCHeader(b []byte) ttrpcHeader {
	return ttrpcHeader{
		length: binary.BigEndian.Uint32(b[0:4]),
		stream: binary.BigEndian.Uint32(b[4:8]),
		typ:    b[8],
	}
}

// headerScanner finds the message headers in a stream of ttrpc writes.
type headerScanner struct {
	hdr  [ttrpcHeaderLen]byte
	n    int    // header bytes gathered
	skip uint32 // payload bytes still to pass over
}

func (s *headerScanner) scan(p []byte, found func(ttrpcHeader)) {
	for len(p) > 0 {
		if s.skip > 0 {
			k := min(uint32(len(p)), s.skip)
			s.skip -= k
			p = p[k:]
			continue
		}
		k := copy(s.hdr[s.n:], p)
		s.n += k
		p = p[k:]
		if s.n == ttrpcHeaderLen {
			h := parseTTRPCHeader(s.hdr[:])
			s.n, s.skip = 0, h.length
			found(h)
		}
	}
}
