package hooks

import "fmt"

// tail is an io.Writer that keeps only the last limit bytes written.
type tail struct {
	limit   int
	buf     []byte
	dropped int
}

func (t *tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > t.limit {
		t.dropped += len(p) - t.limit
		p = p[len(p)-t.limit:]
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		t.dropped += over
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String is what was kept, saying how much came before it.
func (t *tail) String() string {
	if t.dropped == 0 {
		return string(t.buf)
	}
	return fmt.Sprintf("[%d bytes dropped] %s", t.dropped, t.buf)
}
