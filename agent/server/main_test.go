package server

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	ExecHelper()
	if config := os.Getenv(rootfsChildEnv); config != "" {
		os.Exit(rootfsChild(config))
	}
	os.Exit(m.Run())
}
