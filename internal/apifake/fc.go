package apifake

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
)

// FC is a fake Firecracker: a snapshot is loaded only on a fresh process,
// PATCH /vm pauses and resumes, snapshots are taken only while paused, and
// SendCtrlAltDel makes the guest (and so the process) stop.
type FC struct {
	// Fail names operations ("snapshot/load") that fail once valid.
	Fail map[string]bool
	// Version is reported by GET /version.
	Version string
	// IgnoreCtrlAltDel makes the guest ignore SendCtrlAltDel, so the
	// driver has to kill the process.
	IgnoreCtrlAltDel bool
	// Exit is called when the guest has shut down.
	Exit func()
	// Guest is the fake guest's writes, a round each time the VM runs.
	// Loaded with track_dirty_pages, the VMM records the pages they dirty,
	// and a Diff snapshot writes those dirtied since the load or the last
	// snapshot, in a sparse file at their offsets.
	Guest [][]GuestWrite

	mu     sync.Mutex
	state  string // "Not started" until loaded, then Running or Paused
	guest  *guest
	vmst   []byte
	config fcDevices // what GET /vm/config reports
	mem    *guestMemory
	vsock  net.Listener
	host   hostDevs
}

const fcFresh = "Not started"

// Reject formats errors as Firecracker does.
func (f *FC) Reject(msg string) any { return map[string]string{"fault_message": msg} }

func (f *FC) fail(status int, format string, args ...any) Response {
	return Response{Status: status, Body: f.Reject(fmt.Sprintf(format, args...))}
}

// Handle runs one valid request through the state machine.
func (f *FC) Handle(method, op string, body []byte) Response {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == "" {
		f.state = fcFresh
	}
	if f.Fail[op] {
		return f.fail(http.StatusBadRequest, "fake failure of %s", op)
	}
	switch method + " " + op {
	case "GET ":
		return Response{Status: http.StatusOK, Body: map[string]string{
			"app_name": "Firecracker", "id": "anonymous-instance", "state": f.state, "vmm_version": f.Version}}
	case "GET version":
		return Response{Status: http.StatusOK, Body: map[string]string{"firecracker_version": f.Version}}
	case "PUT snapshot/load":
		return f.load(body)
	case "GET vm/config":
		return Response{Status: http.StatusOK, Body: f.config}
	case "PATCH vm":
		return f.patchVM(body)
	case "PUT snapshot/create":
		return f.create(body)
	case "PUT actions":
		return f.action(body)
	}
	return f.fail(http.StatusBadRequest, "the fake does not model %s /%s", method, op)
}

type fcLoad struct {
	SnapshotPath    string `json:"snapshot_path"`
	MemFilePath     string `json:"mem_file_path"`
	TrackDirtyPages bool   `json:"track_dirty_pages"`
	ResumeVM        bool   `json:"resume_vm"`
	MemBackend      *struct {
		BackendType string `json:"backend_type"`
		BackendPath string `json:"backend_path"`
	} `json:"mem_backend"`
	VsockOverride *struct {
		UDSPath string `json:"uds_path"`
	} `json:"vsock_override"`
	NetworkOverrides []struct {
		IfaceID     string `json:"iface_id"`
		HostDevName string `json:"host_dev_name"`
	} `json:"network_overrides"`
}

func (f *FC) load(body []byte) Response {
	if f.state != fcFresh {
		return f.fail(http.StatusBadRequest, "Loading a microVM snapshot not allowed after configuring boot-specific resources.")
	}
	var p fcLoad
	if err := json.Unmarshal(body, &p); err != nil {
		return f.fail(http.StatusBadRequest, "%v", err)
	}
	if (p.MemBackend == nil) == (p.MemFilePath == "") {
		return f.fail(http.StatusBadRequest, "exactly one of mem_backend and mem_file_path must be present")
	}
	if err := f.loadFiles(p); err != nil {
		return f.fail(http.StatusBadRequest, "Load snapshot error: %v", err)
	}
	f.guest = &guest{rounds: f.Guest}
	if p.TrackDirtyPages {
		f.guest.track()
	}
	f.state = "Paused"
	if p.ResumeVM {
		f.state = "Running"
		f.guest.run(f.mem)
	}
	return Response{Status: http.StatusNoContent}
}

func (f *FC) loadFiles(p fcLoad) error {
	var err error
	if f.vmst, err = os.ReadFile(p.SnapshotPath); err != nil {
		return err
	}
	switch {
	case p.MemBackend == nil:
		f.mem, err = loadMemory(p.MemFilePath, true)
	case p.MemBackend.BackendType == "File":
		f.mem, err = loadMemory(p.MemBackend.BackendPath, true)
	default:
		f.mem, err = uffdBackend(p.MemBackend.BackendPath, f.vmst)
	}
	if err != nil {
		return err
	}
	if f.config, err = restoredDevices(f.vmst, p); err != nil {
		return err
	}
	if err := f.openDevices(); err != nil {
		return err
	}
	if p.VsockOverride != nil {
		f.vsock, err = ServeHybridVsock(p.VsockOverride.UDSPath)
	}
	return err
}

// fakeVMState is the fake's vmstate format: what it needs to set up guest
// memory the way Firecracker does from a real vmstate, and the devices a
// real vmstate restores, with the host ends Firecracker opens on load.
type fakeVMState struct {
	MemoryBytes int `json:"memory_bytes"`
	// Devices absent: the guest has one vsock device and nothing else.
	Devices *fcDevices `json:"devices"`
}

// fcDevices is the device part of FullVmConfiguration, as GET /vm/config
// reports a restored VM's devices.
type fcDevices struct {
	Drives []map[string]any `json:"drives,omitempty"`
	Net    []map[string]any `json:"network-interfaces,omitempty"`
	Pmem   []map[string]any `json:"pmem,omitempty"`
	Vsock  map[string]any   `json:"vsock,omitempty"`
}

// restoredDevices applies the load's overrides to the devices vmstate
// carries, failing as Firecracker does on an override that matches no
// device. A vmstate that is not the fake's JSON restores a vsock device.
func restoredDevices(vmstate []byte, p fcLoad) (fcDevices, error) {
	var st fakeVMState
	if json.Unmarshal(vmstate, &st) != nil || st.Devices == nil {
		st.Devices = &fcDevices{Vsock: map[string]any{"guest_cid": 3, "uds_path": ""}}
	}
	d := *st.Devices
	for _, o := range p.NetworkOverrides {
		i := slices.IndexFunc(d.Net, func(n map[string]any) bool { return n["iface_id"] == o.IfaceID })
		if i < 0 {
			return fcDevices{}, fmt.Errorf("unknown network device %q", o.IfaceID)
		}
		d.Net[i]["host_dev_name"] = o.HostDevName
	}
	if p.VsockOverride != nil {
		if d.Vsock == nil {
			return fcDevices{}, errors.New("unknown vsock device")
		}
		d.Vsock["uds_path"] = p.VsockOverride.UDSPath
	}
	return d, nil
}

// openDevices opens the host ends of the restored drives and network
// interfaces as Firecracker does during the load: each drive's file,
// relative to the working directory, read-write unless read-only, and
// each interface's tap by name in the process's network namespace (a name
// no device has makes a new tap). It does not connect vhost-user drives'
// sockets, nor open pmem files.
func (f *FC) openDevices() error {
	for i, d := range f.config.Drives {
		path, _ := d["path_on_host"].(string)
		if socket, _ := d["socket"].(string); socket != "" {
			continue
		}
		ro, _ := d["is_read_only"].(bool)
		if err := f.host.openFile(path, ro); err != nil {
			return fmt.Errorf("drives[%d]: %w", i, err)
		}
	}
	for i, n := range f.config.Net {
		name, _ := n["host_dev_name"].(string)
		if err := f.host.openTap(name, false); err != nil {
			return fmt.Errorf("network-interfaces[%d]: %w", i, err)
		}
	}
	return nil
}

// uffdBackend registers guest memory of the size the vmstate names with
// the page-fault handler on sock.
func uffdBackend(sock string, vmstate []byte) (*guestMemory, error) {
	var st fakeVMState
	if err := json.Unmarshal(vmstate, &st); err != nil || st.MemoryBytes <= 0 {
		return nil, fmt.Errorf("the fake's vmstate must be JSON with memory_bytes > 0 for the Uffd backend (%v)", err)
	}
	return uffdMemory(sock, st.MemoryBytes)
}

func (f *FC) patchVM(body []byte) Response {
	var v struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return f.fail(http.StatusBadRequest, "%v", err)
	}
	from := map[string]string{"Paused": "Running", "Resumed": "Paused"}[v.State]
	if f.state != from {
		return f.fail(http.StatusBadRequest, "cannot set the microVM %s: it is %s", v.State, f.state)
	}
	f.state = map[string]string{"Paused": "Paused", "Resumed": "Running"}[v.State]
	if f.state == "Running" {
		f.guest.run(f.mem)
	}
	return Response{Status: http.StatusNoContent}
}

type fcCreate struct {
	MemFilePath  string `json:"mem_file_path"`
	SnapshotPath string `json:"snapshot_path"`
	SnapshotType string `json:"snapshot_type"`
}

func (f *FC) create(body []byte) Response {
	if f.state != "Paused" {
		return f.fail(http.StatusBadRequest, "Create snapshot error: the microVM is %s, not Paused", f.state)
	}
	var p fcCreate
	if err := json.Unmarshal(body, &p); err != nil {
		return f.fail(http.StatusBadRequest, "%v", err)
	}
	if p.SnapshotType == "Diff" && !f.guest.tracking {
		return f.fail(http.StatusBadRequest, "Diff snapshots are not enabled: load with track_dirty_pages")
	}
	if err := os.WriteFile(p.SnapshotPath, f.vmst, 0o600); err != nil {
		return f.fail(http.StatusBadRequest, "Create snapshot error: %v", err)
	}
	var err error
	if p.SnapshotType == "Diff" {
		err = f.mem.writeSparse(p.MemFilePath, f.guest.dirtyPages())
	} else {
		err = f.mem.writeTo(p.MemFilePath)
		if f.guest.tracking {
			f.guest.dirtyPages() // a snapshot of any type restarts the dirty log
		}
	}
	if err != nil {
		return f.fail(http.StatusBadRequest, "Create snapshot error: %v", err)
	}
	return Response{Status: http.StatusNoContent}
}

func (f *FC) action(body []byte) Response {
	var a struct {
		ActionType string `json:"action_type"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return f.fail(http.StatusBadRequest, "%v", err)
	}
	if a.ActionType != "SendCtrlAltDel" {
		return f.fail(http.StatusBadRequest, "the fake does not model action %s", a.ActionType)
	}
	if f.state != "Running" {
		return f.fail(http.StatusBadRequest, "SendCtrlAltDel needs a running microVM, it is %s", f.state)
	}
	if f.IgnoreCtrlAltDel {
		return Response{Status: http.StatusNoContent}
	}
	return Response{Status: http.StatusNoContent, After: f.Exit}
}
