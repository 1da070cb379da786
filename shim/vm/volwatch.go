package vm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// volumeWatch tells when a volume's directory may have a new version:
// kubelet's atomic writer renames ..data_tmp over ..data, which inotify
// reports as a link moved into the directory. It only wakes the sync up
// sooner; the sync reads ..data itself, so an event too many is harmless
// and one missed (a full queue) waits for the next poll.
type volumeWatch struct {
	f       *os.File
	changed chan struct{}
}

// watchVolume starts watching dir.
func watchVolume(dir string) (*volumeWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch volume %s: %w", dir, err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch volume %s: %w", dir, err)
	}
	w := &volumeWatch{f: os.NewFile(uintptr(fd), "inotify:"+dir), changed: make(chan struct{}, 1)}
	go w.read()
	return w, nil
}

// read turns each batch of events into one wake-up, until close.
func (w *volumeWatch) read() {
	buf := make([]byte, 4096)
	for {
		if _, err := w.f.Read(buf); err != nil {
			if !errors.Is(err, os.ErrClosed) {
				close(w.changed)
			}
			return
		}
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
}

func (w *volumeWatch) close() { w.f.Close() }
