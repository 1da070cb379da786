package agent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"sync"
)

// A virtio-serial port is one byte stream that outlives its host peer: after a
// snapshot restore the guest may still hold half a message from the old host.
// So the stream carries SLIP-delimited frames with a checksum. A cut or mixed
// frame fails its checksum and is dropped, and the next frame delimiter puts
// both ends back in step, whatever came before it.
const (
	frameEnd    = 0xC0 // delimits frames
	frameEsc    = 0xDB // escapes frameEnd/frameEsc inside a frame
	frameEscEnd = 0xDC
	frameEscEsc = 0xDD

	frameHeaderLen = 1 + 8 // type, session
	frameCRCLen    = 4
	// maxFramePayload bounds one frame; longer writes are split.
	maxFramePayload = 32 << 10
	// maxFrameLen bounds a decoded frame; anything longer is garbage.
	maxFrameLen = frameHeaderLen + maxFramePayload + frameCRCLen
)

type frameType byte

const (
	frameSyn  frameType = 1 // host opens a session
	frameAck  frameType = 2 // guest accepts it
	frameData frameType = 3 // payload of a session
	frameFin  frameType = 4 // host closes a session
)

type frame struct {
	typ     frameType
	session uint64
	payload []byte
}

// frameWriter writes whole frames; it is safe for concurrent use.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func newFrameWriter(w io.Writer) *frameWriter {
	return &frameWriter{w: w}
}

// writeFrame encodes f and writes it with one Write call.
func (fw *frameWriter) writeFrame(f frame) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	var hdr [frameHeaderLen]byte
	hdr[0] = byte(f.typ)
	binary.BigEndian.PutUint64(hdr[1:], f.session)
	crc := crc32.Update(crc32.ChecksumIEEE(hdr[:]), crc32.IEEETable, f.payload)
	var sum [frameCRCLen]byte
	binary.BigEndian.PutUint32(sum[:], crc)

	b := append(fw.buf[:0], frameEnd)
	b = escape(b, hdr[:])
	b = escape(b, f.payload)
	b = escape(b, sum[:])
	b = append(b, frameEnd)
	fw.buf = b
	_, err := fw.w.Write(b)
	return err
}

// writeDelimiter ends whatever partial frame the peer may be holding.
func (fw *frameWriter) writeDelimiter() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	_, err := fw.w.Write([]byte{frameEnd})
	return err
}

func escape(dst, src []byte) []byte {
	for _, c := range src {
		switch c {
		case frameEnd:
			dst = append(dst, frameEsc, frameEscEnd)
		case frameEsc:
			dst = append(dst, frameEsc, frameEscEsc)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// frameReader decodes frames, silently dropping corrupt ones.
type frameReader struct {
	r   *bufio.Reader
	buf []byte
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10)}
}

var errBadFrame = errors.New("bad frame")

// readFrame returns the next intact frame. Its payload is valid until the
// next call. Errors are those of the underlying reader.
func (fr *frameReader) readFrame() (frame, error) {
	for {
		raw, err := fr.readRaw()
		if errors.Is(err, errBadFrame) {
			continue
		}
		if err != nil {
			return frame{}, err
		}
		if f, ok := decodeFrame(raw); ok {
			return f, nil
		}
	}
}

// readRaw reads the unescaped bytes up to the next delimiter.
func (fr *frameReader) readRaw() ([]byte, error) {
	b := fr.buf[:0]
	bad := false
	for {
		c, err := fr.r.ReadByte()
		if err != nil {
			return nil, err
		}
		switch {
		case c == frameEnd:
			fr.buf = b
			if bad || len(b) == 0 {
				return nil, errBadFrame
			}
			return b, nil
		case c == frameEsc:
			n, err := fr.r.ReadByte()
			if err != nil {
				return nil, err
			}
			switch n {
			case frameEscEnd:
				c = frameEnd
			case frameEscEsc:
				c = frameEsc
			default:
				bad = true
				if n == frameEnd {
					fr.buf = b
					return nil, errBadFrame
				}
			}
		}
		if len(b) >= maxFrameLen {
			bad = true
			continue
		}
		b = append(b, c)
	}
}

func decodeFrame(raw []byte) (frame, bool) {
	if len(raw) < frameHeaderLen+frameCRCLen {
		return frame{}, false
	}
	body, sum := raw[:len(raw)-frameCRCLen], raw[len(raw)-frameCRCLen:]
	if crc32.ChecksumIEEE(body) != binary.BigEndian.Uint32(sum) {
		return frame{}, false
	}
	f := frame{
		typ:     frameType(body[0]),
		session: binary.BigEndian.Uint64(body[1:frameHeaderLen]),
		payload: body[frameHeaderLen:],
	}
	return f, f.typ >= frameSyn && f.typ <= frameFin
}
