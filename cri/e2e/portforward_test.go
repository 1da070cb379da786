package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/network"
)

// forwardingFrom is what crictl port-forward prints once it listens.
var forwardingFrom = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> \d+`)

// portForward runs crictl port-forward to port of pod p (kubectl
// port-forward's path: containerd's CRI dials localhost:port in the pod's
// network namespace) and returns the local port it listens on, inside the
// node's namespace. The crictl process ends at cleanup.
func (n *node) portForward(t *testing.T, p *pod, port int) int {
	t.Helper()
	args := append(n.stack.CrictlArgs(), "port-forward", p.id, fmt.Sprintf("0:%d", port))
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
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
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
		return p
	case <-time.After(time.Minute):
		t.Fatalf("crictl port-forward did not listen within a minute: %s", stderr.String())
		return 0
	}
}

// fetchForwarded GETs / through the forward at local port in the node's
// namespace and returns the response, headers and body, read to its end.
func (n *node) fetchForwarded(t *testing.T, local int) (string, error) {
	t.Helper()
	ns, err := network.Open(n.net.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var c net.Conn
	// The dial runs on ns's thread; the socket stays in ns after.
	if err := ns.Do(func() error {
		c, err = net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", local), 10*time.Second)
		return err
	}); err != nil {
		return "", fmt.Errorf("dial the forward: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return "", fmt.Errorf("send the request: %w", err)
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// checkPortForward fetches the app's page through crictl port-forward,
// from several connections at once, and checks that a port nothing in the
// pod listens on fails at once rather than hanging.
func (w *podWorkload) checkPortForward(t *testing.T) {
	local := w.n.portForward(t, w.p, 8080)
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			resp, err := w.n.fetchForwarded(t, local)
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
	closed := w.n.portForward(t, w.p, 8081)
	began := time.Now()
	resp, _ := w.n.fetchForwarded(t, closed)
	if strings.Contains(resp, podPage) || time.Since(began) > 20*time.Second {
		t.Fatalf("a forward to a port nothing listens on answered %q after %s, want nothing, at once",
			resp, time.Since(began).Round(time.Millisecond))
	}
}
