package apifake

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// hostPort is the port the fakes report in "OK <port>", as Firecracker and
// Cloud Hypervisor report the host side of the new connection.
const hostPort = 1073741824

// ServeHybridVsock listens on path as a Cloud Hypervisor or Firecracker
// vsock device's host socket does: a client writes "CONNECT <port>\n", gets
// "OK <n>\n", and then talks to the guest. The fake guest echoes bytes.
func ServeHybridVsock(path string) (net.Listener, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on vsock socket: %w", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveVsockConn(c)
		}
	}()
	return ln, nil
}

func serveVsockConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	port, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "CONNECT ")
	if _, perr := strconv.ParseUint(port, 10, 32); !ok || perr != nil {
		return
	}
	if _, err := fmt.Fprintf(c, "OK %d\n", hostPort); err != nil {
		return
	}
	_, _ = io.Copy(c, br)
}
