package server

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	if config := os.Getenv(rootfsChildEnv); config != "" {
		os.Exit(rootfsChild(config))
	}
	if sh := os.Getenv(firstForkChildEnv); sh != "" {
		os.Exit(firstForkChild(sh))
	}
	os.Exit(m.Run())
}
