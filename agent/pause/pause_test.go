package pause

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// asPauseEnv has the test binary run Main, as the pause's binary does.
const asPauseEnv = "COCOON_PAUSE_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asPauseEnv) == "1" {
		Main()
	}
	os.Exit(m.Run())
}

// TestPause: with WarmFlag the pause exits 0 at once; without, it waits
// until SIGTERM and then exits 0.
func TestPause(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		signal bool
	}{
		{name: "warm", args: []string{WarmFlag}},
		{name: "waits for SIGTERM", signal: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], tt.args...)
			cmd.Env = append(os.Environ(), asPauseEnv+"=1")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			if tt.signal {
				select {
				case err := <-exited:
					t.Fatalf("the pause ended before a signal: %v", err)
				case <-time.After(time.Second):
				}
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("the pause ended with %v, want exit 0", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the pause did not end")
			}
		})
	}
}
