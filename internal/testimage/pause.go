package testimage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BuildPause builds the pause program (./pause) static into dir and
// returns its path. It needs the go command on PATH, which `go test` gives
// its test binaries.
func BuildPause(ctx context.Context, dir string) (string, error) {
	return buildProgram(ctx, dir, "pause")
}

// buildProgram builds the program in this package's dir name static into
// dir and returns its path.
func buildProgram(ctx context.Context, dir, name string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build %s: %w: want the go command on PATH", name, err)
	}
	_, file, _, _ := runtime.Caller(0)
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, goTool, "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = filepath.Join(filepath.Dir(file), name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", name, err, msg)
	}
	return out, nil
}

// Pause is the pod sandbox image named name: the static pause program at
// /pause, its entrypoint, and nothing else. dir holds the build.
func Pause(ctx context.Context, name, dir string) (Image, error) {
	bin, err := BuildPause(ctx, dir)
	if err != nil {
		return Image{}, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return Image{}, fmt.Errorf("pause image: %w", err)
	}
	return Image{
		Name:   name,
		Config: ocispec.ImageConfig{Entrypoint: []string{"/pause"}},
		Layers: []Layer{{File("pause", 0o755, data)}},
	}, nil
}
