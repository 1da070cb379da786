package uffd

import "sort"

// span is the half-open interval [start, end).
type span struct{ start, end uint64 }

// rangeSet is a set of addresses kept as sorted, disjoint, non-adjacent
// spans, so a balloon that removes gigabytes costs one entry, not one per
// page.
type rangeSet struct {
	spans []span
}

// add inserts [start, end), merging it with every span it touches.
func (r *rangeSet) add(start, end uint64) {
	if start >= end {
		return
	}
	// First span that ends at or after start: it may touch the new one.
	i := sort.Search(len(r.spans), func(i int) bool { return r.spans[i].end >= start })
	j := i
	for j < len(r.spans) && r.spans[j].start <= end {
		start = min(start, r.spans[j].start)
		end = max(end, r.spans[j].end)
		j++
	}
	r.spans = append(r.spans[:i], append([]span{{start, end}}, r.spans[j:]...)...)
}

// intersects reports whether any address in [start, end) is in the set.
func (r *rangeSet) intersects(start, end uint64) bool {
	i := sort.Search(len(r.spans), func(i int) bool { return r.spans[i].end > start })
	return i < len(r.spans) && r.spans[i].start < end
}
