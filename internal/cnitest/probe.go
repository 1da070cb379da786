package cnitest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// probeTimeout bounds a probe whose context has no deadline.
const probeTimeout = 10 * time.Second

// Dial opens a connection from inside the namespace.
func (s *Namespace) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := s.Do(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen opens a listener inside the namespace.
func (s *Namespace) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := s.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// HTTPGet sends GET url from inside the namespace and returns the body of
// a 200 response.
func (s *Namespace) HTTPGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DialContext: s.Dial, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s: read body: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// Ping sends ICMP echo requests to ip from inside the namespace, one every
// 200 ms, until one is answered or ctx (10 s if it has no deadline) ends.
func (s *Namespace) Ping(ctx context.Context, ip net.IP) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var conn *icmp.PacketConn
	if err := s.Do(func() error {
		var err error
		conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return fmt.Errorf("ping %s: %w", ip, err)
	}
	defer conn.Close()
	id, payload := os.Getpid()&0xffff, []byte("cnitest "+ip.String())
	for seq := 1; ; seq++ {
		if err := echo(conn, ip, id, seq, payload); err != nil {
			return fmt.Errorf("ping %s: %w", ip, err)
		}
		if replied(conn, ip, id, payload, 200*time.Millisecond) {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ping %s: no reply to %d echo requests: %w", ip, seq, ctx.Err())
		}
	}
}

func echo(conn *icmp.PacketConn, ip net.IP, id, seq int, payload []byte) error {
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	_, err = conn.WriteTo(b, &net.IPAddr{IP: ip})
	return err
}

// replied reads until an echo reply from ip carrying payload arrives or
// wait passes.
func replied(conn *icmp.PacketConn, ip net.IP, id int, payload []byte, wait time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1500)
	for {
		n, peer, err := conn.ReadFrom(buf)
		if err != nil {
			return false
		}
		msg, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || msg.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		e, ok := msg.Body.(*icmp.Echo)
		if ok && e.ID == id && bytes.Equal(e.Data, payload) && peer.(*net.IPAddr).IP.Equal(ip) {
			return true
		}
	}
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, probeTimeout)
}
