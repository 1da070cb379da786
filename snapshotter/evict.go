package snapshotter

import (
	"context"
	"slices"
	"sync"

	"github.com/containerd/log"
)

// evictor runs the flat cache's eviction passes in one background
// goroutine. Unlinking a large fragmented file can take seconds (ext4 with
// discard), which no Prepare or Remove should wait for. Requests made while
// a pass runs coalesce into one more pass.
type evictor struct {
	kick  chan struct{}      // holds at most one pending request
	flush chan chan struct{} // run a pass now, then close the channel
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newEvictor() evictor {
	return evictor{
		kick:  make(chan struct{}, 1),
		flush: make(chan chan struct{}),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
}

// startEvictor starts the background eviction goroutine; closeEvictor
// stops it.
func (c *flatCache) startEvictor(ctx context.Context) {
	go c.evictLoop(ctx)
}

func (c *flatCache) evictLoop(ctx context.Context) {
	defer close(c.evictor.done)
	for {
		select {
		case <-c.evictor.stop:
			return
		case <-c.evictor.kick:
			c.evict(ctx)
		case ack := <-c.evictor.flush:
			c.evict(ctx)
			close(ack)
		}
	}
}

// requestEvict asks for an eviction pass without waiting for it.
func (c *flatCache) requestEvict() {
	select {
	case c.evictor.kick <- struct{}{}:
	default: // a pass is already pending and will see this change too
	}
}

// evictNow runs an eviction pass and returns when it is done, so that a
// test sees the result of every request made before the call.
func (c *flatCache) evictNow() {
	ack := make(chan struct{})
	select {
	case c.evictor.flush <- ack:
		<-ack
	case <-c.evictor.done:
	}
}

// closeEvictor stops the eviction goroutine, cutting a running pass short
// between files, and waits for it to exit.
func (c *flatCache) closeEvictor() {
	c.evictor.once.Do(func() { close(c.evictor.stop) })
	<-c.evictor.done
}

func (c *flatCache) stopping() bool {
	select {
	case <-c.evictor.stop:
		return true
	default:
		return false
	}
}

// evict removes unpinned orphans, then unpinned files, least recently used
// first, until the cache fits its budget. Pinned files are skipped: a
// running VM may read them. Only the eviction goroutine calls it.
func (c *flatCache) evict(ctx context.Context) {
	names, total := c.lru()
	for _, name := range names {
		if c.stopping() {
			return
		}
		if c.isOrphan(name) {
			total -= c.evictOne(ctx, name)
		}
	}
	if c.budget == 0 {
		return
	}
	for _, name := range names {
		if total <= c.budget || c.stopping() {
			return
		}
		total -= c.evictOne(ctx, name)
	}
	if total > c.budget {
		log.G(ctx).WithFields(log.Fields{"allocated": total, "budget": c.budget}).
			Warn("flat cache over budget: every remaining file is pinned by a staged snapshot")
	}
}

// evictOne removes the named file unless it is pinned and returns the
// bytes freed.
func (c *flatCache) evictOne(ctx context.Context, name string) int64 {
	c.locks.Lock(name)
	size, err := c.removeUnpinned(name)
	c.locks.Unlock(name)
	if err != nil {
		log.G(ctx).WithError(err).WithField("name", name).Warn("evicting flat file")
	}
	if size > 0 {
		log.G(ctx).WithFields(log.Fields{"name": name, "allocated": size}).Info("evicted flat file")
	}
	return size
}

func (c *flatCache) isOrphan(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[name]
	return ok && e.orphan
}

// names returns the indexed names.
func (c *flatCache) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, 0, len(c.entries))
	for n := range c.entries {
		names = append(names, n)
	}
	return names
}

// lru returns the indexed names, least recently used first, and their total size.
func (c *flatCache) lru() ([]string, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var total int64
	names := make([]string, 0, len(c.entries))
	for n, e := range c.entries {
		names = append(names, n)
		total += e.size
	}
	slices.SortFunc(names, func(a, b string) int { return c.entries[a].used.Compare(c.entries[b].used) })
	return names, total
}
