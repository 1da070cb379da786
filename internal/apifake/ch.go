package apifake

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Cloud Hypervisor snapshot directory entries.
const (
	CHConfigFile = "config.json"
	CHStateFile  = "state.json"
	CHMemoryFile = "memory-ranges"
)

// CH is a fake Cloud Hypervisor VMM: one VM, restored on a fresh process,
// then paused, resumed, snapshotted and shut down as the real one allows.
type CH struct {
	// Fail names operations ("vm.restore") that fail once valid.
	Fail map[string]bool
	// Version is reported by vmm.ping.
	Version string
	// Exit is called after vmm.shutdown has been answered.
	Exit func()
	// Spec, if set, is the API spec a restored config.json must conform
	// to (VmConfig), as Cloud Hypervisor parses it into one. A spec whose
	// VmSnapshotConfig has snapshot_type (the cocoonstack fork) makes
	// "diff" snapshots: the first writes a full baseline and starts dirty
	// tracking, each later one the pages dirtied since the one before, in a
	// sparse file at their offsets. Without it the field is ignored.
	Spec *Spec
	// Guest is the fake guest's writes, a round each time the VM runs.
	Guest [][]GuestWrite

	mu     sync.Mutex
	state  string // "" until restored, then Running, Paused or Shutdown
	config json.RawMessage
	vmst   []byte
	mem    *guestMemory
	vsock  net.Listener
	host   hostDevs
	guest  *guest
}

// Reject formats errors as Cloud Hypervisor does: plain text.
func (f *CH) Reject(msg string) any { return "Error parsing request: " + msg }

// Handle runs one valid request through the state machine.
func (f *CH) Handle(method, op string, body []byte) Response {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Fail[op] {
		return Response{Status: http.StatusBadRequest, Body: "fake failure of " + op}
	}
	switch op {
	case "vmm.ping":
		return Response{Status: http.StatusOK, Body: map[string]any{"version": f.Version, "pid": os.Getpid()}}
	case "vmm.shutdown":
		return Response{Status: http.StatusNoContent, After: f.Exit}
	case "vm.info":
		if f.state == "" {
			return Response{Status: http.StatusNotFound, Body: "VM is not created"}
		}
		return Response{Status: http.StatusOK, Body: map[string]any{"config": f.config, "state": f.state}}
	case "vm.restore":
		return f.restore(body)
	case "vm.pause":
		return f.transition("Running", "Paused")
	case "vm.resume":
		r := f.transition("Paused", "Running")
		if r.Status == http.StatusNoContent {
			f.guest.run(f.mem)
		}
		return r
	case "vm.shutdown":
		return f.transition("", "Shutdown")
	case "vm.snapshot":
		return f.snapshot(body)
	}
	return Response{Status: http.StatusBadRequest, Body: "the fake does not model " + op}
}

// transition moves the VM from "from" (any created state if empty) to "to":
// 404 when no VM exists, 405 when it is in the wrong state.
func (f *CH) transition(from, to string) Response {
	switch {
	case f.state == "":
		return Response{Status: http.StatusNotFound, Body: "VM is not created"}
	case from != "" && f.state != from:
		return Response{Status: http.StatusMethodNotAllowed, Body: fmt.Sprintf("VM is %s, not %s", f.state, from)}
	}
	f.state = to
	return Response{Status: http.StatusNoContent}
}

type chRestore struct {
	SourceURL         string `json:"source_url"`
	MemoryRestoreMode string `json:"memory_restore_mode"`
	Resume            bool   `json:"resume"`
}

func (f *CH) restore(body []byte) Response {
	if f.state != "" {
		return Response{Status: http.StatusNotFound, Body: "VM is already created"}
	}
	var rc chRestore
	if err := json.Unmarshal(body, &rc); err != nil {
		return Response{Status: http.StatusBadRequest, Body: err.Error()}
	}
	dir, ok := strings.CutPrefix(rc.SourceURL, "file://")
	if !ok {
		return Response{Status: http.StatusBadRequest, Body: "source_url must be a file:// URL"}
	}
	if err := f.load(dir, rc.MemoryRestoreMode); err != nil {
		return Response{Status: http.StatusInternalServerError, Body: "restore: " + err.Error()}
	}
	f.state = "Paused"
	f.guest = &guest{rounds: f.Guest}
	if rc.Resume {
		f.state = "Running"
		f.guest.run(f.mem)
	}
	return Response{Status: http.StatusNoContent}
}

func (f *CH) load(dir, mode string) error {
	config, err := os.ReadFile(filepath.Join(dir, CHConfigFile))
	if err != nil {
		return err
	}
	if f.Spec != nil {
		if err := f.Spec.ValidateJSON("VmConfig", config); err != nil {
			return fmt.Errorf("%s: %w", CHConfigFile, err)
		}
	}
	var cfg chConfig
	if err := json.Unmarshal(config, &cfg); err != nil {
		return fmt.Errorf("parse %s: %w", CHConfigFile, err)
	}
	if err := f.openDevices(cfg); err != nil {
		return err
	}
	if f.vmst, err = os.ReadFile(filepath.Join(dir, CHStateFile)); err != nil {
		return err
	}
	lazy := mode == "OnDemand" || mode == "CopyOnWrite"
	if f.mem, err = loadMemory(filepath.Join(dir, CHMemoryFile), lazy); err != nil {
		return err
	}
	if cfg.Vsock != nil && cfg.Vsock.Socket != "" {
		if f.vsock, err = ServeHybridVsock(cfg.Vsock.Socket); err != nil {
			return err
		}
	}
	f.config = config
	return nil
}

// chConfig is the part of a config.json (VmConfig) whose host ends the
// fake opens on restore.
type chConfig struct {
	Vsock *struct {
		Socket string `json:"socket"`
	} `json:"vsock"`
	Net []struct {
		Tap       string `json:"tap"`
		NumQueues int    `json:"num_queues"`
		VhostUser bool   `json:"vhost_user"`
	} `json:"net"`
	Disks []struct {
		Path      string `json:"path"`
		Readonly  bool   `json:"readonly"`
		ImageType string `json:"image_type"`
		VhostUser bool   `json:"vhost_user"`
	} `json:"disks"`
}

// openDevices opens the host ends of the network devices and disks as
// Cloud Hypervisor does when it creates them on restore: each tap by name
// in the process's network namespace (a null tap makes a new one), each
// disk image at its path. The fake does not model vhost-user.
func (f *CH) openDevices(cfg chConfig) error {
	for i, n := range cfg.Net {
		if n.VhostUser {
			return fmt.Errorf("net[%d]: the fake does not model vhost-user", i)
		}
		// num_queues counts rx and tx queues: 2 is one pair (the default).
		if err := f.host.openTap(n.Tap, n.NumQueues > 2); err != nil {
			return fmt.Errorf("net[%d]: %w", i, err)
		}
	}
	for i, d := range cfg.Disks {
		if d.VhostUser {
			return fmt.Errorf("disks[%d]: the fake does not model vhost-user", i)
		}
		if d.Path == "" {
			return fmt.Errorf("disks[%d]: no disk path", i)
		}
		if err := f.host.openDisk(d.Path, d.Readonly, d.ImageType); err != nil {
			return fmt.Errorf("disks[%d]: %w", i, err)
		}
	}
	return nil
}

type chSnapshot struct {
	DestinationURL string `json:"destination_url"`
	SnapshotType   string `json:"snapshot_type"`
}

func (f *CH) snapshot(body []byte) Response {
	if r := f.transition("Paused", "Paused"); r.Status != http.StatusNoContent {
		return r
	}
	var sc chSnapshot
	if err := json.Unmarshal(body, &sc); err != nil {
		return Response{Status: http.StatusBadRequest, Body: err.Error()}
	}
	dir, ok := strings.CutPrefix(sc.DestinationURL, "file://")
	if !ok {
		return Response{Status: http.StatusBadRequest, Body: "destination_url must be a file:// URL"}
	}
	diff := sc.SnapshotType == "diff" && f.Spec != nil && f.Spec.HasProperty("VmSnapshotConfig", "snapshot_type")
	if err := f.save(dir, diff); err != nil {
		return Response{Status: http.StatusInternalServerError, Body: "snapshot: " + err.Error()}
	}
	return Response{Status: http.StatusNoContent}
}

func (f *CH) save(dir string, diff bool) error {
	if err := os.WriteFile(filepath.Join(dir, CHConfigFile), f.config, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, CHStateFile), f.vmst, 0o600); err != nil {
		return err
	}
	mem := filepath.Join(dir, CHMemoryFile)
	switch {
	case diff && f.guest.tracking:
		return f.mem.writeSparse(mem, f.guest.dirtyPages())
	case diff:
		f.guest.track()
	}
	return f.mem.writeTo(mem)
}
