package cloudhypervisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

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

// restorePrefix starts the name of the snapshot directory a restore
// builds in the staged directory.
const restorePrefix = "cloud-hypervisor-restore-"

// materialize builds the snapshot directory Cloud Hypervisor restores from:
// config.json patched to this VM's run directory, state.json as staged, and
// memory-ranges a hard link of the staged memory file. vm.restore takes
// only a directory (source_url) and reads memory-ranges from it by that
// name, so the memory cannot be named where it is staged. The directory is
// made in the staged directory, a private one per container, because only
// there a hard link is sure to work: link(2) fails with EXDEV across mount
// points, even bind mounts of one filesystem, and the staged directory the
// shim gets is such a bind mount. A hard link keeps the staged inode, so
// clones share its page cache. On error nothing is left behind.
func materialize(staged *chain.Staged, runDir string) (_ string, retErr error) {
	dir, err := os.MkdirTemp(staged.Dir, restorePrefix)
	if err != nil {
		return "", fmt.Errorf("create restore dir beside the staged memory: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	raw, err := os.ReadFile(staged.StatePath(configFile))
	if err != nil {
		return "", fmt.Errorf("read staged %s: %w", configFile, err)
	}
	patched, err := patchConfig(raw, runDir)
	if err != nil {
		return "", fmt.Errorf("patch %s: %w", configFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), patched, 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", configFile, err)
	}
	state, err := os.ReadFile(staged.StatePath(stateFile))
	if err != nil {
		return "", fmt.Errorf("read staged %s: %w", stateFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, stateFile), state, 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", stateFile, err)
	}
	if err := os.Link(staged.MemoryPath(), filepath.Join(dir, memoryFile)); err != nil {
		return "", fmt.Errorf("link staged memory: %w", err)
	}
	return dir, nil
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
