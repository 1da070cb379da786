package server

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/user"
)

// bootRoot is the guest's own root as the agent read it when it first
// started since the guest booted: the users' home directories, and "/" and
// what the default PATH's directories hold. While those files are as the
// boot left them (no process has run since, and Init wrote none of them),
// a process in the guest's root is resolved from it: a restored clone then
// reads no file to start its process, file system code its CPU would
// translate anew on every restore.
type bootRoot struct {
	homes   map[uint32]string
	modes   map[string]fs.FileMode // by path, following symbolic links
	scanned map[string]bool        // directories whose every entry modes holds
}

// readBootRoot reads the guest's root; nil if it cannot.
func readBootRoot() *bootRoot {
	b := &bootRoot{homes: map[uint32]string{}, modes: map[string]fs.FileMode{}, scanned: map[string]bool{}}
	users, err := user.ParsePasswdFile(passwdPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	for _, u := range users {
		if _, ok := b.homes[uint32(u.Uid)]; !ok && u.Uid >= 0 {
			b.homes[uint32(u.Uid)] = u.Home
		}
	}
	fi, err := os.Stat("/")
	if err != nil {
		return nil
	}
	b.modes["/"] = fi.Mode()
	for _, dir := range filepath.SplitList(strings.TrimPrefix(defaultPath, "PATH=")) {
		if !b.scan(dir) {
			return nil
		}
	}
	return b
}

// scan records every entry of dir; a directory that does not exist has
// none.
func (b *bootRoot) scan(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if fi, err := os.Stat(p); err == nil {
			b.modes[p] = fi.Mode()
		}
	}
	b.scanned[dir] = true
	return true
}

// home is uid's home directory, "/" for a uid without one, as homeOf.
func (b *bootRoot) home(uid uint32) string {
	if h, ok := b.homes[uid]; ok {
		return h
	}
	return "/"
}

// lookup says what the view knows of p: known is false when it holds
// neither p nor its directory; else exists says whether p exists, and mode
// is what os.Stat(p).Mode() would say.
func (b *bootRoot) lookup(p string) (mode fs.FileMode, exists, known bool) {
	if m, ok := b.modes[p]; ok {
		return m, true, true
	}
	return 0, false, b.scanned[filepath.Dir(p)]
}

// covers says whether writing p would change what the view holds.
func (b *bootRoot) covers(p string) bool {
	return p == passwdPath || b.scanned[filepath.Dir(p)]
}
