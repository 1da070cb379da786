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
// config.json patched to this VM's run directory and host's backends (see
// patchConfig), state.json as staged (its rootfs slot's size set to the
// image behind it, see setRootfsSize), and memory-ranges a hard link of
// the staged memory file. vm.restore takes only a directory (source_url)
// and reads memory-ranges from it by that name, so the memory cannot be
// named where it is staged. The directory is made in the staged directory,
// a private one per container, because only there a hard link is sure to
// work: link(2) fails with EXDEV across mount points, even bind mounts of
// one filesystem, and the staged directory the shim gets is such a bind
// mount. A hard link keeps the staged inode, so clones share its page
// cache. On error nothing is left behind in the staged directory.
func materialize(staged *chain.Staged, runDir string, host hostBackends) (_ string, _ patched, retErr error) {
	raw, err := chain.ReadLinkFile(staged.StatePath(configFile), maxConfigJSON)
	if err != nil {
		return "", patched{}, fmt.Errorf("read staged %s: %w", configFile, err)
	}
	p, err := patchConfig(raw, runDir, host)
	if err != nil {
		return "", patched{}, fmt.Errorf("patch %s: %w", configFile, err)
	}
	dir, err := os.MkdirTemp(staged.Dir, restorePrefix)
	if err != nil {
		return "", patched{}, fmt.Errorf("create restore dir beside the staged memory: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, configFile), p.config, 0o600); err != nil {
		return "", patched{}, fmt.Errorf("write %s: %w", configFile, err)
	}
	if err := stageState(staged, dir, p.rootfs); err != nil {
		return "", patched{}, err
	}
	if err := os.Link(staged.MemoryPath(), filepath.Join(dir, memoryFile)); err != nil {
		return "", patched{}, fmt.Errorf("link staged memory: %w", err)
	}
	return dir, p, nil
}

// stageState puts state.json in dir: copied as staged, never read whole
// (Cloud Hypervisor parses it), unless the snapshot has a rootfs slot,
// whose recorded size is then set to the image behind it.
func stageState(staged *chain.Staged, dir string, rootfs *rootfsSlot) error {
	dst := filepath.Join(dir, stateFile)
	if rootfs == nil {
		if err := chain.CopyStateFile(staged.StatePath(stateFile), dst); err != nil {
			return fmt.Errorf("stage %s: %w", stateFile, err)
		}
		return nil
	}
	if err := rootfs.prepare(); err != nil {
		return err
	}
	raw, err := chain.ReadLinkFile(staged.StatePath(stateFile), chain.MaxStateFile)
	if err != nil {
		return fmt.Errorf("read staged %s: %w", stateFile, err)
	}
	out, err := setRootfsSize(raw, rootfs)
	if err != nil {
		return fmt.Errorf("patch %s: %w", stateFile, err)
	}
	if err := os.WriteFile(dst, out, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", stateFile, err)
	}
	return nil
}

// patched is a config.json rewritten for one restore.
type patched struct {
	config []byte
	// ownNetNS: the snapshot's network device gets a tap Cloud Hypervisor
	// creates itself, so it must run in a network namespace of its own.
	ownNetNS bool
	// rootfs is the snapshot's rootfs slot; nil when it has none.
	rootfs *rootfsSlot
}

// patchConfig rewrites a snapshot's config.json for this VM: fields that
// name host files, sockets or devices are pointed at runDir or at host's
// backends (see backDevices), dropped, or refused (see vmConfigSchema),
// and every other field is kept as it was: the config comes from whatever
// build made the snapshot, and a field dropped here would be a device lost
// on restore.
func patchConfig(raw []byte, runDir string, host hostBackends) (patched, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return patched{}, fmt.Errorf("parse: %w", err)
	}
	if isNull(cfg["vsock"]) {
		return patched{}, fmt.Errorf("no vsock device: the guest agent would be unreachable")
	}
	clean, err := sanitize("", raw, vmConfigSchema)
	if err != nil {
		return patched{}, err
	}
	if err := json.Unmarshal(clean, &cfg); err != nil {
		return patched{}, fmt.Errorf("parse: %w", err)
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
			return patched{}, err
		}
	}
	p, err := backDevices(cfg, runDir, host)
	if err != nil {
		return patched{}, err
	}
	if p.config, err = json.Marshal(cfg); err != nil {
		return patched{}, err
	}
	return p, nil
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
