// Package config is cocoon's config.toml: schema, defaults and validation.
//
// The same file serves the shim and the snapshotter; each reads the sections
// it needs. Unknown keys and bad values are errors naming the key.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/docker/go-units"
	"github.com/pelletier/go-toml/v2"
)

// DefaultPath is where the shim and snapshotter look when told nothing else.
const DefaultPath = "/etc/cocoon/config.toml"

// EnvPath names the environment variable that overrides DefaultPath.
const EnvPath = "COCOON_CONFIG"

// Config is the whole file.
type Config struct {
	Hypervisor      string          `toml:"hypervisor"`
	Restore         Restore         `toml:"restore"`
	Agent           Agent           `toml:"agent"`
	Shim            Shim            `toml:"shim"`
	QEMU            QEMU            `toml:"qemu"`
	CloudHypervisor CloudHypervisor `toml:"cloud_hypervisor"`
	Firecracker     Firecracker     `toml:"firecracker"`
	Snapshotter     Snapshotter     `toml:"snapshotter"`
}

// Restore is the restore-mode policy's part of the runtime class config.
type Restore struct {
	// Mode asks for a restore mode: auto (the best the hypervisor has),
	// mmap, ondemand or copy.
	Mode string `toml:"mode"`
	// Strict fails a restore whose mode the hypervisor cannot do instead of
	// falling back to the next best.
	Strict bool `toml:"strict"`
	// AllowAnnotation lets the io.cocoon.restore-mode annotation choose.
	AllowAnnotation bool `toml:"allow_annotation"`
	// LazyWindows allows mmap/ondemand for Windows guests (they default to copy).
	LazyWindows bool `toml:"lazy_windows"`
	// ForceMode is a deployment-wide override that beats everything else.
	ForceMode string `toml:"force_mode"`
	// BaseImage is the snapshot image a task restores when its own image
	// is an ordinary OCI image, whose layers become the VM's root
	// filesystem; empty refuses such tasks.
	BaseImage string `toml:"base_image"`
	// BaseImages are base snapshot images of several sizes (guest memory),
	// smallest first, instead of BaseImage: a pod's VM restores the
	// smallest that holds the pod's memory, a container's own VM the
	// largest its memory limit holds.
	BaseImages []string `toml:"base_images"`
	// MaxGuestMemory bounds the guest memory a snapshot may restore with;
	// 0 means the host's RAM. MaxVCPUs bounds its vCPUs; 0 means the
	// host's CPUs. A snapshot image states both, so both are the image's
	// to choose only within these.
	MaxGuestMemory Size `toml:"max_guest_memory"`
	MaxVCPUs       int  `toml:"max_vcpus"`
	// BaseSnapshotter is the containerd snapshotter (the cocoon proxy
	// plugin's name) the base image is staged through.
	BaseSnapshotter string `toml:"base_snapshotter"`
}

// Bases are the base snapshot images, smallest first: BaseImages, else
// BaseImage alone; none when neither is set.
func (r Restore) Bases() []string {
	if len(r.BaseImages) > 0 {
		return r.BaseImages
	}
	if r.BaseImage != "" {
		return []string{r.BaseImage}
	}
	return nil
}

// Agent holds the guest agent timeouts.
type Agent struct {
	ConnectTimeout Duration `toml:"connect_timeout"`
	CallTimeout    Duration `toml:"call_timeout"`
}

// Shim is the runtime's own settings.
type Shim struct {
	// RunDir holds per-VM run directories (sockets, logs).
	RunDir string `toml:"run_dir"`
	// RestoreTimeout bounds a whole restore, spawn to agent ready.
	RestoreTimeout Duration `toml:"restore_timeout"`
	// MemoryHeadroom is added to a container's memory limit for the
	// hypervisor's own memory when the limit becomes the VM's cgroup limit.
	MemoryHeadroom Size `toml:"memory_headroom"`
	// HookTimeout bounds each OCI hook of a task's spec that sets no
	// timeout of its own. runc lets such a hook run forever; here a
	// poststop hook that never ends would hold the task's delete, and its
	// shim, for good.
	HookTimeout Duration `toml:"hook_timeout"`
	// PodVM says what a Kubernetes pod's VM is: "pod" (the default), one
	// VM for the whole pod, restored for its sandbox, with every container
	// joining it, as Kubernetes expects of a pod; or "container", a VM per
	// app container (the sandbox a host process), which a pod whose
	// container is a snapshot image needs.
	PodVM string `toml:"pod_vm"`
	// WarmRunc has a pod's VM have the guest's runc create and delete a
	// throwaway container, at idle priority, as soon as it is up, so that
	// under TCG, where a restored guest translates anew all the code it
	// runs, the first container's `runc create` finds runc's path
	// translated (with OwnInit, the guest's own container init makes it).
	// Under KVM there is nothing to gain: turn it off there.
	WarmRunc bool `toml:"warm_runc"`
	// OwnInit (the default) has a pod VM's containers made by the guest's
	// own container init (agent/cinit) instead of its runc: the same
	// namespaces, mounts, cgroup and confinement, without runc's processes
	// on a container's path (a warm create ~35 ms under TCG against
	// runc's ~170). Off, the guest's runc makes them.
	OwnInit bool `toml:"own_init"`
	// PooledVM (the default) has the spare task server, started after a
	// task whose VM could have been restored ahead (an ordinary image on a
	// base snapshot, a pod's VM or a snapshot image, sharing no directory
	// with its guest), restore one like it and warm it at idle priority
	// for the next such task to claim: its create then skips the restore
	// and most of what the guest translates anew after one. A waiting VM
	// holds its memory (one per spare: ~50 MiB PSS for a 512 MiB snapshot
	// under TCG) and serves one task only; false has every task restore
	// its own VM on its path.
	PooledVM bool `toml:"pooled_vm"`
	// Spares is how many spare task servers wait per containerd, for a
	// burst of task starts to find one each (spare.MaxSpares at most); with
	// PooledVM each holds a VM.
	Spares int `toml:"spares"`
	// PoolCgroup is the cgroup (a cgroupfs path) the pooled VMs wait in,
	// all of a node's together, apart from containerd's and the tasks'; a
	// claim moves its VM into the task's cgroup (the memory it touched
	// while waiting stays charged here: no kernel moves charges now).
	PoolCgroup string `toml:"pool_cgroup"`
	// PoolMemory, if set, bounds the resident memory of the VMs waiting in
	// PoolCgroup: a fill finding them at it restores none (0: no bound
	// beside the count of spares).
	PoolMemory Size `toml:"pool_memory"`
	// CopyFiles and CopyBytes bound what one VM's guest holds of copies
	// of the host's files (bind sources, Kubernetes volumes, each kept in
	// step while it lives): entries (files, directories, links) and bytes
	// of file data, for a pod's VM all its containers' together. The
	// copies live in guest memory.
	CopyFiles int  `toml:"copy_files"`
	CopyBytes Size `toml:"copy_bytes"`
}

// The values of shim.pod_vm.
const (
	PodVMPod       = "pod"
	PodVMContainer = "container"
)

// QEMU configures the QEMU driver.
type QEMU struct {
	Binary string `toml:"binary"`
	// Accel is auto (probe), kvm or tcg.
	Accel string `toml:"accel"`
	// CPU is the -cpu model; empty picks one that suits the accelerator.
	CPU string `toml:"cpu"`
}

// CloudHypervisor configures the Cloud Hypervisor driver.
type CloudHypervisor struct {
	Binary string `toml:"binary"`
	// CopyOnWrite says whether the binary accepts memory_restore_mode
	// CopyOnWrite: probe (ask the binary), yes (a pinned fork build) or no.
	CopyOnWrite string `toml:"copy_on_write"`
}

// Firecracker configures the Firecracker driver.
type Firecracker struct {
	Binary string `toml:"binary"`
}

// Snapshotter configures cocoon-snapshotter.
type Snapshotter struct {
	Root    string `toml:"root"`
	Address string `toml:"address"`
	// FlatCacheSize is the byte budget for flattened chain memory files,
	// e.g. "64GiB"; "0" means unlimited.
	FlatCacheSize Size `toml:"flat_cache_size"`
	// MaxRootfsSize bounds the files of an ordinary image (sizes, holes
	// included) converted into a VM's root filesystem image; "0" means
	// unlimited.
	MaxRootfsSize Size `toml:"max_rootfs_size"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Hypervisor: "qemu",
		Restore:    Restore{Mode: "auto", BaseSnapshotter: "cocoon"},
		Agent: Agent{
			ConnectTimeout: Duration(10 * time.Second),
			CallTimeout:    Duration(10 * time.Second),
		},
		Shim: Shim{
			RunDir:         "/run/cocoon",
			RestoreTimeout: Duration(60 * time.Second),
			MemoryHeadroom: Size(256 << 20),
			HookTimeout:    Duration(time.Minute),
			PodVM:          PodVMPod,
			WarmRunc:       true,
			OwnInit:        true,
			PooledVM:       true,
			Spares:         1,
			PoolCgroup:     "/cocoon-pool",
			CopyFiles:      2048,
			CopyBytes:      Size(32 << 20),
		},
		QEMU:            QEMU{Binary: "qemu-system-x86_64", Accel: "auto"},
		CloudHypervisor: CloudHypervisor{Binary: "cloud-hypervisor", CopyOnWrite: "probe"},
		Firecracker:     Firecracker{Binary: "firecracker"},
		Snapshotter: Snapshotter{
			Root:          "/var/lib/cocoon/snapshotter",
			Address:       "/run/cocoon/snapshotter.sock",
			MaxRootfsSize: Size(32 << 30),
		},
	}
}

// Parse reads a config over the defaults, rejecting unknown keys and bad values.
func Parse(data []byte) (Config, error) {
	return ParseOver(Default(), data)
}

// ParseOver reads a config over base, as Parse does over the defaults:
// what data does not set keeps base's value.
func ParseOver(base Config, data []byte) (Config, error) {
	c := base
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			return Config{}, fmt.Errorf("unknown key %s", unknownKeys(strict))
		}
		var derr *toml.DecodeError
		if errors.As(err, &derr) {
			row, col := derr.Position()
			return Config{}, fmt.Errorf("line %d column %d: %s", row, col, derr.Error())
		}
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func unknownKeys(e *toml.StrictMissingError) string {
	keys := make([]string, 0, len(e.Errors))
	for _, d := range e.Errors {
		keys = append(keys, strings.Join(d.Key(), "."))
	}
	return strings.Join(keys, ", ")
}

// Resolve picks the config file: explicit (runtime options ConfigPath), else
// $COCOON_CONFIG, else DefaultPath if it exists. ok is false when none
// applies and the built-in defaults should be used.
func Resolve(explicit string) (path string, ok bool) {
	if explicit != "" {
		return explicit, true
	}
	if p := os.Getenv(EnvPath); p != "" {
		return p, true
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		return DefaultPath, true
	}
	return "", false
}

// Size is a byte count written as "512MiB", "64G" or a plain number.
type Size int64

// UnmarshalText parses a human-readable size.
func (s *Size) UnmarshalText(b []byte) error {
	n, err := units.RAMInBytes(string(b))
	if err != nil || n < 0 {
		return fmt.Errorf("bad size %q: want a byte count such as 512MiB or 64G", b)
	}
	*s = Size(n)
	return nil
}

// MarshalText writes the size in bytes.
func (s Size) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprint(int64(s))), nil
}

// Duration is a time.Duration written as "10s", "250ms".
type Duration time.Duration

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil || v < 0 {
		return fmt.Errorf("bad duration %q: want a positive duration such as 10s", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as Go does.
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(time.Duration(d).String()), nil
}

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
