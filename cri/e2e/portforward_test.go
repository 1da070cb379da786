package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// forwardingFrom is what crictl port-forward prints once it listens.
var forwardingFrom = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> \d+`)

// portForward runs crictl port-forward to port of pod podID (kubectl
// port-forward's path: containerd's CRI dials localhost:port in the pod's
// network namespace) and returns the local port it listens on, inside the
// node's namespace, and a func that ends the crictl process (also run at
// cleanup).
func (n *node) portForward(t testing.TB, podID string, port int) (int, func()) {
	t.Helper()
	args := append(n.stack.CrictlArgs(), "port-forward", podID, fmt.Sprintf("0:%d", port))
	cmd := exec.Command(args[0], args[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := forwardingFrom.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case local := <-found:
		p, _ := strconv.Atoi(local) // the pattern's digits
		return p, stop
	case <-time.After(time.Minute):
		t.Fatalf("crictl port-forward did not listen within a minute: %s", stderr.String())
		return 0, nil
	}
}

// fetchForwarded GETs path through the forward at local port in the
// node's namespace and returns the response, headers and body, read to its
// end.
func (n *node) fetchForwarded(t testing.TB, local int, path string) (string, error) {
	t.Helper()
	return n.fetchFromNode(t, fmt.Sprintf("127.0.0.1:%d", local), path)
}

// fetchFromNode GETs path at addr from the node's namespace and returns
// the response, headers and body, read to its end.
func (n *node) fetchFromNode(t testing.TB, addr, path string) (string, error) {
	t.Helper()
	var b strings.Builder
	err := n.getFromNode(t, addr, path, &b)
	return b.String(), err
}

// getForwarded GETs path through the forward at local port in the node's
// namespace into w.
func (n *node) getForwarded(t testing.TB, local int, path string, w io.Writer) error {
	t.Helper()
	return n.getFromNode(t, fmt.Sprintf("127.0.0.1:%d", local), path, w)
}

// getFromNode GETs path at addr (an IPv4 host and port) from the node's
// namespace into w.
func (n *node) getFromNode(t testing.TB, addr, path string, w io.Writer) error {
	t.Helper()
	ns, err := network.Open(n.net.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var c net.Conn
	// The dial runs on ns's thread; the socket stays in ns after.
	if err := ns.Do(func() error {
		c, err = net.DialTimeout("tcp4", addr, 10*time.Second)
		return err
	}); err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	// A client that reads the body's length and closes, as curl does:
	// containerd's CRI ends a forward a second after one of its directions
	// ended, so one waiting for the end of the stream waits that second, and
	// one that half-closes early gets a second of the answer.
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n"); err != nil {
		return fmt.Errorf("send the request: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("read the response: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// checkPortForward fetches the app's page through crictl port-forward,
// from several connections at once, and checks that a port nothing in the
// pod listens on fails at once rather than hanging.
func (w *podWorkload) checkPortForward(t *testing.T) {
	local, _ := w.n.portForward(t, w.p.id, 8080)
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			resp, err := w.n.fetchForwarded(t, local, "/")
			if err == nil && !strings.Contains(resp, podPage) {
				err = fmt.Errorf("the forwarded page is %q, want it to hold %q", resp, podPage)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	closed, _ := w.n.portForward(t, w.p.id, 8081)
	began := time.Now()
	resp, _ := w.n.fetchForwarded(t, closed, "/")
	if strings.Contains(resp, podPage) || time.Since(began) > 20*time.Second {
		t.Fatalf("a forward to a port nothing listens on answered %q after %s, want nothing, at once",
			resp, time.Since(began).Round(time.Millisecond))
	}
}
