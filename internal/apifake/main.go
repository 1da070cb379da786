package apifake

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// Environment of a fake VMM process (see Fake.Script).
const (
	envFake      = "COCOON_FAKE_VMM"
	envSpec      = "COCOON_FAKE_SPEC"
	envRecord    = "COCOON_FAKE_RECORD"
	envFail      = "COCOON_FAKE_FAIL"
	envVersion   = "COCOON_FAKE_VERSION"
	envIgnoreCAD = "COCOON_FAKE_IGNORE_CTRL_ALT_DEL"
	envName      = "COCOON_FAKE_NAME"
	envHang      = "COCOON_FAKE_HANG"
	envGuest     = "COCOON_FAKE_GUEST_WRITES"
)

// RunIfFake turns the current process into a fake VMM when it was started
// as one (a test binary re-executed by a driver through a Fake script), and
// never returns then. Call it first thing in TestMain.
func RunIfFake() {
	if os.Getenv(envFake) == "" {
		return
	}
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs a fake VMM with the real binaries' command line:
// `cloud-hypervisor --api-socket path=SOCK`, `firecracker --api-sock SOCK`,
// or either with --version. The spec (from the environment) decides which
// API is validated; the flag decides which state machine runs.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fake-vmm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	chSock := fs.String("api-socket", "", "Cloud Hypervisor: path=SOCK")
	fcSock := fs.String("api-sock", "", "Firecracker: SOCK")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	v := os.Getenv(envVersion)
	if *version {
		fmt.Fprintf(stdout, "%s %s\n", os.Getenv(envName), v)
		return 0
	}
	var model Model
	var sock string
	exit := make(chan struct{})
	fail := failSet(os.Getenv(envFail))
	writes, err := parseGuestWrites(os.Getenv(envGuest))
	if err != nil {
		fmt.Fprintln(stderr, "fake-vmm:", err)
		return 2
	}
	switch {
	case *chSock != "":
		sock = strings.TrimPrefix(*chSock, "path=")
		model = &CH{Fail: fail, Version: v, Exit: func() { close(exit) }, Guest: writes}
	case *fcSock != "":
		sock = *fcSock
		model = &FC{Fail: fail, Version: v, IgnoreCtrlAltDel: os.Getenv(envIgnoreCAD) != "", Exit: func() { close(exit) }, Guest: writes}
	default:
		fmt.Fprintln(stderr, "fake-vmm: need --api-socket path=SOCK or --api-sock SOCK")
		return 2
	}
	spec, err := LoadSpec(os.Getenv(envSpec))
	if err != nil {
		fmt.Fprintln(stderr, "fake-vmm:", err)
		return 1
	}
	if ch, ok := model.(*CH); ok {
		ch.Spec = spec
	}
	if err := serve(sock, spec, model, exit); err != nil {
		fmt.Fprintln(stderr, "fake-vmm:", err)
		return 1
	}
	return 0
}

func serve(sock string, spec *Spec, model Model, exit <-chan struct{}) error {
	var record io.Writer
	if p := os.Getenv(envRecord); p != "" {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("open request record: %w", err)
		}
		defer f.Close()
		record = f
	}
	if p := os.Getenv(envRecord); p != "" {
		if err := appendLine(p+pidsSuffix, strconv.Itoa(os.Getpid())); err != nil {
			return err
		}
	}
	srv := NewServer(spec, model, record)
	srv.Hang = failSet(os.Getenv(envHang))
	ln, err := srv.ServeUnix(sock)
	if err != nil {
		return err
	}
	defer ln.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-exit:
	case <-sig:
	}
	return nil
}

// pidsSuffix names the file beside a record listing the fake processes
// started, one pid a line.
const pidsSuffix = ".pids"

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	_, err = fmt.Fprintln(f, line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func failSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, op := range strings.Split(s, ",") {
		if op != "" {
			m[op] = true
		}
	}
	return m
}
