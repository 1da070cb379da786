package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/fsnotify/fsnotify"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/shim/task"
)

// liveVolume matches the host directories of the volumes kubelet updates
// in place: ConfigMap, Secret, downward API and projected (service account
// tokens). Its atomic writer puts each version in a timestamped directory
// and renames the ..data link over to it; a volume's keys are links
// through ..data.
var liveVolume = regexp.MustCompile(`/volumes/kubernetes\.io~(configmap|secret|projected|downward-api)/[^/]+$`)

const (
	volumeData = "..data"
	// volumeSyncInterval is how often a live volume's ..data is read
	// besides when inotify says it changed: an update inotify missed
	// reaches the guest within about this and the copy's time.
	volumeSyncInterval = 500 * time.Millisecond
)

// fileUpdater is the agent's UpdateFiles.
type fileUpdater interface {
	UpdateFiles(ctx context.Context, files []agent.File, remove []string) error
}

// volumeSync keeps the guest's copy of a live volume in step with the
// host's, in the order kubelet's atomic writer keeps: the new version's
// directory, ..data swapped to it in one rename, new keys' links, then the
// old keys' links and the old version removed. A reader in the guest sees
// the old set or the new, never a mix.
type volumeSync struct {
	host, guest string
	agent       fileUpdater
	copies      *copyBudget
	data        string            // the version ..data names in the guest
	held        copyUsage         // what that version's copy takes of copies
	keys        map[string]string // the guest's key links and their targets
	lastErr     string
}

// newVolumeSync starts from the copy files made of host at guest.
func newVolumeSync(host, guest string, a fileUpdater, copies *copyBudget, files []agent.File) *volumeSync {
	v := &volumeSync{host: host, guest: guest, agent: a, copies: copies, keys: map[string]string{}}
	for _, f := range files {
		if f.Mode&fs.ModeSymlink == 0 || path.Dir(f.Path) != guest {
			continue
		}
		switch name := path.Base(f.Path); {
		case name == volumeData:
			v.data = string(f.Data)
		case !strings.HasPrefix(name, ".."):
			v.keys[name] = string(f.Data)
		}
	}
	v.held = versionUsage(files, v.guest, v.data)
	return v
}

// sync brings the guest's copy to the host's version, if it changed.
func (v *volumeSync) sync(ctx context.Context) error {
	target, err := os.Readlink(filepath.Join(v.host, volumeData))
	if err != nil {
		return fmt.Errorf("read the version of volume %s: %w", v.host, err)
	}
	if target == v.data {
		return nil
	}
	if strings.Contains(target, "/") || !strings.HasPrefix(target, "..") || target == ".." {
		return fmt.Errorf("volume %s: %s names %q, expected a directory of the volume's own", v.host, volumeData, target)
	}
	// The guest holds both versions until the old one's removal.
	b := binds{budget: v.copies}
	if err := b.copy(filepath.Join(v.host, target), path.Join(v.guest, target)); err != nil {
		return fmt.Errorf("copy volume %s: %w", v.host, err)
	}
	keys, err := hostKeys(v.host)
	if err != nil {
		return err
	}
	links, remove := v.keyChanges(keys)
	gone := copyUsage{files: len(remove)}
	added := copyUsage{files: len(keys) - len(v.keys) + gone.files}
	if err := v.copies.take(b.used.plus(added)); err != nil {
		return fmt.Errorf("copy volume %s: %w", v.host, err)
	}
	files := append(b.files, guestLink(path.Join(v.guest, volumeData), target))
	files = append(files, links...)
	if v.data != "" {
		remove = append(remove, path.Join(v.guest, v.data))
	}
	if err := v.agent.UpdateFiles(ctx, files, remove); err != nil {
		v.copies.give(b.used.plus(added))
		return fmt.Errorf("update volume %s in the guest: %w", v.host, err)
	}
	v.copies.give(v.held.plus(gone))
	v.data, v.keys, v.held = target, keys, b.used
	return nil
}

// keyChanges are the links to make for keys new or changed in keys, and
// the paths of the keys gone.
func (v *volumeSync) keyChanges(keys map[string]string) (links []agent.File, gone []string) {
	for name, to := range keys {
		if v.keys[name] != to {
			links = append(links, guestLink(path.Join(v.guest, name), to))
		}
	}
	for name := range v.keys {
		if _, ok := keys[name]; !ok {
			gone = append(gone, path.Join(v.guest, name))
		}
	}
	return links, gone
}

// versionUsage is what the copy of a volume's version data takes: the
// version's directory and what is under it.
func versionUsage(files []agent.File, guest, data string) copyUsage {
	if data == "" {
		return copyUsage{}
	}
	dir := path.Join(guest, data)
	return usageOf(files, dir).plus(copyUsage{files: 1})
}

func guestLink(p, target string) agent.File {
	return agent.File{Path: p, Data: []byte(target), Mode: fs.ModeSymlink | fs.ModePerm}
}

// hostKeys are the volume's key links, by name, with their targets.
func hostKeys(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list volume %s: %w", dir, err)
	}
	keys := map[string]string{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") || e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		to, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read volume %s: %w", dir, err)
		}
		keys[e.Name()] = to
	}
	return keys, nil
}

// run syncs when inotify says the volume changed (kubelet's atomic
// writer moves the new ..data link in), and every volumeSyncInterval
// besides, for what inotify misses, until stop closes. The sync reads
// ..data itself, so an event too many costs a readlink.
func (v *volumeSync) run(ctx context.Context, stop <-chan struct{}, timeout time.Duration) {
	t := time.NewTicker(volumeSyncInterval)
	defer t.Stop()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := watchVolume(v.host); err == nil {
		defer w.Close()
		events, errs = w.Events, w.Errors
	} else {
		log.G(ctx).WithError(err).WithField("volume", v.host).Info("live volume polled only")
	}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case _, ok := <-events:
			if !ok {
				events, errs = nil, nil // the watch ended: poll only
			}
		case _, ok := <-errs: // an overflowed queue: look now
			if !ok {
				events, errs = nil, nil
			}
		}
		v.report(ctx, v.syncWithin(ctx, timeout))
	}
}

// watchVolume watches the volume's directory for links moved or made in it.
func watchVolume(dir string) (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch volume %s: %w", dir, err)
	}
	if err := w.Add(dir); err != nil {
		return nil, errors.Join(fmt.Errorf("watch volume %s: %w", dir, err), w.Close())
	}
	return w, nil
}

func (v *volumeSync) syncWithin(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return v.sync(ctx)
}

// report logs a sync's failure once until it changes or clears.
func (v *volumeSync) report(ctx context.Context, err error) {
	switch {
	case err == nil:
		v.lastErr = ""
	case err.Error() != v.lastErr:
		v.lastErr = err.Error()
		log.G(ctx).WithError(err).WithField("volume", v.host).Warn("live volume not synced")
	}
}

// volumeGuest is a guest whose live volumes are kept in step, and its
// shares served, until it closes: a pod VM's sandbox, or a container's
// own VM.
type volumeGuest struct {
	task.Guest
	live   *liveVolumes
	shares *vmShares // nil: none
}

// Close ends the volumes' syncs and the shares, then the guest.
func (g volumeGuest) Close() error {
	g.live.close()
	if g.shares != nil {
		g.shares.close(context.Background())
	}
	return g.Guest.Close()
}
