package testenv

import (
	"net"
	"testing"
)

// ServeTCP listens on a free port of 127.0.0.1 until t ends and runs serve
// on each connection, which it closes after; it returns the port.
func ServeTCP(t testing.TB, serve func(net.Conn)) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}
