package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxFileSize bounds config.toml; real ones are a few KiB.
const maxFileSize = 1 << 20

// Load reads the config file at path over the defaults; an empty path
// resolves as Resolve does, and to the defaults when no file applies, as
// does /dev/null (an empty config, as commands' --config /dev/null mean).
//
// The path may come from a runtime class or the environment, so Load is
// strict about what it reads: a regular file of at most 1 MiB, opened
// without following a symlink as its last element and without blocking
// (a FIFO or a device is an error, never a hang or an endless read).
// Keys that name a host path or a program, or that the node shares
// (hostKeys), are honoured only
// from a trusted file: owned by root, or by the user running this process,
// and writable by nobody else. From any other file, such a key set to
// anything but its default is an error naming the key.
func Load(path string) (Config, error) {
	if path == "" {
		var ok bool
		if path, ok = Resolve(""); !ok {
			return Default(), nil
		}
	}
	if path == os.DevNull {
		return Default(), nil
	}
	data, fi, err := readFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if why := untrusted(fi); err == nil && why != nil {
		err = checkHostKeys(c, why)
	}
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// readFile reads the config file at path as Load describes, and returns
// its info from the open file.
func readFile(path string) ([]byte, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, nil, fmt.Errorf("%s is a symbolic link: name the file itself", path)
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, nil, fmt.Errorf("%s is not a regular file (mode %v)", path, fi.Mode())
	case fi.Size() > maxFileSize:
		return nil, nil, fmt.Errorf("%s is %d bytes, larger than the %d allowed", path, fi.Size(), maxFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, nil, fmt.Errorf("%s grew past the %d bytes allowed", path, maxFileSize)
	}
	return data, fi, nil
}

// untrusted says why a file with info fi may not set host keys, or nil.
func untrusted(fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("its owner is unknown")
	}
	switch {
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("the file is owned by uid %d, not root", st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("the file is writable by group or others (mode %v)", fi.Mode().Perm())
	}
	return nil
}

// hostKeys are the keys that name a host path or a program to run, or
// set what the whole node shares (the pool's cgroup and its limit).
var hostKeys = []string{
	"shim.run_dir", "qemu.binary", "cloud_hypervisor.binary", "firecracker.binary",
	"snapshotter.root", "snapshotter.address", "shim.pool_cgroup", "shim.pool_memory",
}

// hostValues returns c's values of hostKeys, in order.
func (c Config) hostValues() []string {
	return []string{
		c.Shim.RunDir, c.QEMU.Binary, c.CloudHypervisor.Binary, c.Firecracker.Binary,
		c.Snapshotter.Root, c.Snapshotter.Address, c.Shim.PoolCgroup, strconv.FormatInt(int64(c.Shim.PoolMemory), 10),
	}
}

// checkHostKeys fails if c sets a host key to anything but its default;
// why says why the file may not.
func checkHostKeys(c Config, why error) error {
	got, def := c.hostValues(), Default().hostValues()
	for i, key := range hostKeys {
		if got[i] != def[i] {
			return fmt.Errorf("%s = %q: a key naming a host path or program, or one the node shares, is honoured only from a file owned by root and writable by nobody else: %w", key, got[i], why)
		}
	}
	return nil
}

// LoadTask is a task's config: its runtime options' inline body (a CRI
// handler's options table), else the file they name, as Load resolves it.
func LoadTask(path, body string) (Config, error) {
	if body == "" {
		return Load(path)
	}
	c, err := Parse([]byte(body))
	if err != nil {
		return Config{}, fmt.Errorf("runtime options: %w", err)
	}
	return c, nil
}
