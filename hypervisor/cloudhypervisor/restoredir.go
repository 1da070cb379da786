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

// maxConfigJSON bounds config.json, a few KiB of device configuration;
// state.json is bounded by chain.MaxStateFile.
const maxConfigJSON = 1 << 20

// stateFiles are the hypervisor state files of a Cloud Hypervisor link.
var stateFiles = []string{configFile, stateFile}

// restorePrefix starts the name of the snapshot directory a restore
// builds in the staged directory.
const restorePrefix = "cloud-hypervisor-restore-"

// materialize builds the snapshot directory Cloud Hypervisor restores from:
// config.json patched to this VM's run directory (see patchConfig; no host
// backends for network or disk devices yet), state.json as staged, and
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
	raw, err := chain.ReadLinkFile(staged.StatePath(configFile), maxConfigJSON)
	if err != nil {
		return "", fmt.Errorf("read staged %s: %w", configFile, err)
	}
	patched, err := patchConfig(raw, runDir, hostBackends{})
	if err != nil {
		return "", fmt.Errorf("patch %s: %w", configFile, err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), patched, 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", configFile, err)
	}
	// Copied, never read whole: Cloud Hypervisor parses it.
	if err := chain.CopyStateFile(staged.StatePath(stateFile), filepath.Join(dir, stateFile)); err != nil {
		return "", fmt.Errorf("stage %s: %w", stateFile, err)
	}
	if err := os.Link(staged.MemoryPath(), filepath.Join(dir, memoryFile)); err != nil {
		return "", fmt.Errorf("link staged memory: %w", err)
	}
	return dir, nil
}

// hostBackends are the host ends a restore gives the snapshot's network
// and disk devices, in device order; the ones the image names are never
// used. A device without one fails the restore.
type hostBackends struct {
	// Taps are the tap interfaces of net[0], net[1], ...
	Taps []string
	// Disks are the image files of disks[0], disks[1], ...
	Disks []string
}

// patchConfig rewrites a snapshot's config.json for this VM: fields that
// name host files, sockets or devices are pointed at runDir or at host's
// backends, dropped, or refused (see vmConfigSchema), and every other
// field is kept as it was: the config comes from whatever build made the
// snapshot, and a field dropped here would be a device lost on restore.
func patchConfig(raw []byte, runDir string, host hostBackends) ([]byte, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if isNull(cfg["vsock"]) {
		return nil, fmt.Errorf("no vsock device: the guest agent would be unreachable")
	}
	clean, err := sanitize("", raw, vmConfigSchema)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(clean, &cfg); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	patches := []struct {
		device, field, path string
	}{
		{"vsock", "socket", filepath.Join(runDir, vsockSock)},
		{"serial", "socket", filepath.Join(runDir, "serial.sock")},
		{"serial", "file", filepath.Join(runDir, "serial.log")},
		{"console", "socket", filepath.Join(runDir, "console.sock")},
		{"console", "file", filepath.Join(runDir, "console.log")},
		{"debug_console", "file", filepath.Join(runDir, "debug-console.log")},
		// The only entropy source a guest gets; it is CH's default too.
		{"rng", "src", "/dev/urandom"},
	}
	for _, p := range patches {
		if err := setPath(cfg, p.device, p.field, p.path); err != nil {
			return nil, err
		}
	}
	if err := setBackends(cfg, "net", "tap", host.Taps); err != nil {
		return nil, err
	}
	if err := setBackends(cfg, "disks", "path", host.Disks); err != nil {
		return nil, err
	}
	return json.Marshal(cfg)
}

// setBackends sets field of each cfg[device] element to the value of the
// same index: a device without one, or a value without a device, fails.
func setBackends(cfg map[string]json.RawMessage, device, field string, values []string) error {
	var devs []map[string]json.RawMessage
	if !isEmpty(cfg[device]) {
		if err := json.Unmarshal(cfg[device], &devs); err != nil {
			return fmt.Errorf("%s: want an array of objects: %w", device, err)
		}
	}
	switch {
	case len(devs) > len(values):
		return fmt.Errorf("%s[%d]: the snapshot has a device this restore gives no host %s for (the image's own is never used)", device, len(values), field)
	case len(devs) < len(values):
		return fmt.Errorf("%s: this restore gives %d host backends for the snapshot's %d devices", device, len(values), len(devs))
	case len(devs) == 0:
		return nil
	}
	for i, v := range values {
		devs[i][field], _ = json.Marshal(v)
	}
	b, err := json.Marshal(devs)
	if err != nil {
		return fmt.Errorf("%s: %w", device, err)
	}
	cfg[device] = b
	return nil
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
