package launch

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// warn logs a problem `start` worked around through the bundle's shim log
// fifo, which containerd reads into its own log: `start`'s stdout and
// stderr are its answer to containerd, where a log line would corrupt it.
// With no reader on the fifo the line is dropped.
func warn(id, msg string, err error) {
	f, ferr := os.OpenFile("log", os.O_WRONLY|unix.O_NONBLOCK, 0)
	if ferr != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "time=%q level=warning msg=%s error=%s id=%s runtime=io.containerd.cocoon.v2\n",
		time.Now().Format(time.RFC3339Nano), strconv.Quote(msg), strconv.Quote(err.Error()), strconv.Quote(id))
}
