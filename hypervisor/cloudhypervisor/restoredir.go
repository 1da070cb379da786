package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/log"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
	"github.com/cocoonstack/containerd-shim-cocoon/hypervisor/internal/vmmproc"
)

// Files of a Cloud Hypervisor snapshot directory (the source_url of
// vm.restore and the destination_url of vm.snapshot).
const (
	configFile = "config.json"
	stateFile  = "state.json"
	memoryFile = "memory-ranges"
)

// stateFiles are the hypervisor state files of a Cloud Hypervisor link.
var stateFiles = []string{configFile, stateFile}

// materialize builds dir, the snapshot directory Cloud Hypervisor restores
// from: config.json patched to this VM's run directory, state.json as
// staged, and memory-ranges as the staged memory file itself.
func materialize(ctx context.Context, staged *chain.Staged, runDir, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create restore dir: %w", err)
	}
	raw, err := os.ReadFile(staged.StatePath(configFile))
	if err != nil {
		return fmt.Errorf("read staged %s: %w", configFile, err)
	}
	patched, err := patchConfig(raw, runDir)
	if err != nil {
		return fmt.Errorf("patch %s: %w", configFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), patched, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", configFile, err)
	}
	state, err := os.ReadFile(staged.StatePath(stateFile))
	if err != nil {
		return fmt.Errorf("read staged %s: %w", stateFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, stateFile), state, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", stateFile, err)
	}
	return linkMemory(ctx, staged.MemoryPath(), filepath.Join(dir, memoryFile))
}

// linkMemory makes dst name the staged memory file. A hard link keeps the
// same inode, so clones share its page cache; across filesystems a symlink
// to the staged link (which pins the inode) is the only way to keep that.
func linkMemory(ctx context.Context, src, dst string) error {
	err := os.Link(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		log.G(ctx).WithField("memory", src).Info("run dir is on another filesystem than the staged chain: linking memory by symlink")
		err = os.Symlink(src, dst)
	}
	if err != nil {
		return fmt.Errorf("link staged memory: %w", err)
	}
	return nil
}

// patchConfig points the devices of a snapshot's config.json whose host
// ends are files or sockets at runDir, keeping every field it does not
// know as it was: the config comes from whatever build made the
// snapshot, and a field dropped here would be a device lost on restore.
func patchConfig(raw []byte, runDir string) ([]byte, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if isNull(cfg["vsock"]) {
		return nil, fmt.Errorf("no vsock device: the guest agent would be unreachable")
	}
	patches := []struct {
		device, field, path string
	}{
		{"vsock", "socket", filepath.Join(runDir, vsockSock)},
		{"serial", "socket", filepath.Join(runDir, "serial.sock")},
		{"serial", "file", filepath.Join(runDir, "serial.log")},
		{"console", "socket", filepath.Join(runDir, "console.sock")},
		{"console", "file", filepath.Join(runDir, "console.log")},
	}
	for _, p := range patches {
		if err := setPath(cfg, p.device, p.field, p.path); err != nil {
			return nil, err
		}
	}
	return json.Marshal(cfg)
}

// setPath sets cfg[device][field] to path where the snapshot set it (a
// null or absent field stays so: the device does not use it).
func setPath(cfg map[string]json.RawMessage, device, field, path string) error {
	if isNull(cfg[device]) {
		return nil
	}
	var dev map[string]json.RawMessage
	if err := json.Unmarshal(cfg[device], &dev); err != nil {
		return fmt.Errorf("%s: want an object: %w", device, err)
	}
	if isNull(dev[field]) {
		return nil
	}
	if field == "socket" {
		if err := vmmproc.CheckSockPath(path); err != nil {
			return fmt.Errorf("%s.%s: %w", device, field, err)
		}
	}
	dev[field], _ = json.Marshal(path)
	b, err := json.Marshal(dev)
	if err != nil {
		return fmt.Errorf("%s: %w", device, err)
	}
	cfg[device] = b
	return nil
}

func isNull(v json.RawMessage) bool {
	return len(v) == 0 || string(v) == "null"
}
