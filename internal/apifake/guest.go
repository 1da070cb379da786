package apifake

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// The fakes run no guest, so a test says what their guest writes: each
// time a restored VM starts running, the fake applies the next round of
// GuestWrites to its memory. A VMM that tracks dirty pages records them,
// and its diff snapshots write exactly those pages.

// GuestWrite is the fake guest filling Length bytes at Offset with Fill;
// offsets and lengths are whole 4 KiB pages.
type GuestWrite struct {
	Offset, Length int64
	Fill           byte
}

// guestPage is the fakes' page size.
const guestPage = 4096

// encodeGuestWrites is the environment form of rounds of writes:
// "off:len:fill,..." per round, rounds separated by ";".
func encodeGuestWrites(rounds [][]GuestWrite) string {
	var rs []string
	for _, r := range rounds {
		var ws []string
		for _, w := range r {
			ws = append(ws, fmt.Sprintf("%d:%d:%d", w.Offset, w.Length, w.Fill))
		}
		rs = append(rs, strings.Join(ws, ","))
	}
	return strings.Join(rs, ";")
}

func parseGuestWrites(s string) ([][]GuestWrite, error) {
	if s == "" {
		return nil, nil
	}
	var rounds [][]GuestWrite
	for _, r := range strings.Split(s, ";") {
		var round []GuestWrite
		for _, w := range strings.Split(r, ",") {
			if w == "" {
				continue
			}
			f := strings.Split(w, ":")
			if len(f) != 3 {
				return nil, fmt.Errorf("guest write %q: want off:len:fill", w)
			}
			off, err1 := strconv.ParseInt(f[0], 10, 64)
			n, err2 := strconv.ParseInt(f[1], 10, 64)
			fill, err3 := strconv.ParseUint(f[2], 10, 8)
			if err1 != nil || err2 != nil || err3 != nil || off%guestPage != 0 || n <= 0 || n%guestPage != 0 {
				return nil, fmt.Errorf("guest write %q: want whole pages and a byte", w)
			}
			round = append(round, GuestWrite{Offset: off, Length: n, Fill: byte(fill)})
		}
		rounds = append(rounds, round)
	}
	return rounds, nil
}

// guest runs the rounds of writes and tracks dirty pages for a VMM model.
type guest struct {
	rounds [][]GuestWrite
	// tracking: the VMM records dirtied pages in dirty.
	tracking bool
	dirty    map[int64]bool
}

// run applies the next round to mem.
func (g *guest) run(mem *guestMemory) {
	if len(g.rounds) == 0 || mem == nil {
		return
	}
	round := g.rounds[0]
	g.rounds = g.rounds[1:]
	for _, w := range round {
		for off := w.Offset; off < w.Offset+w.Length; off += guestPage {
			mem.write(off, bytes.Repeat([]byte{w.Fill}, guestPage))
			if g.tracking {
				g.dirty[off] = true
			}
		}
	}
}

// track starts (or restarts) dirty page tracking.
func (g *guest) track() {
	g.tracking, g.dirty = true, map[int64]bool{}
}

// dirtyPages lists the dirtied pages in order, and forgets them: a VMM's
// dirty log restarts with each snapshot.
func (g *guest) dirtyPages() []int64 {
	pages := make([]int64, 0, len(g.dirty))
	for p := range g.dirty {
		pages = append(pages, p)
	}
	slices.Sort(pages)
	g.dirty = map[int64]bool{}
	return pages
}

// writeSparse saves pages of mem into a new file at path of the memory's
// size, leaving every other page a hole, as a diff snapshot writes it.
func (m *guestMemory) writeSparse(path string, pages []int64) error {
	size, err := m.size()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create memory file: %w", err)
	}
	err = out.Truncate(size)
	buf := make([]byte, guestPage)
	for _, p := range pages {
		if err != nil {
			break
		}
		if err = m.read(p, buf); err == nil {
			_, err = out.WriteAt(buf, p)
		}
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write memory file: %w", err)
	}
	return nil
}
