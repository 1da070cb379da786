package soak

import (
	"fmt"
	"slices"
	"strings"
)

// Count is one thing the soak counts before and after: its value and what
// makes it up (pids, paths, names), to say what is left when it moved.
type Count struct {
	Name  string
	Value int
	// Items describe the units counted, one line each (a flat file's line
	// carries its link count, which its value adds).
	Items []string
}

// Census is every count at one moment, in a fixed order.
type Census []Count

// Get returns the count called name.
func (c Census) Get(name string) (Count, bool) {
	i := slices.IndexFunc(c, func(x Count) bool { return x.Name == name })
	if i < 0 {
		return Count{}, false
	}
	return c[i], true
}

// Moved is one count that differs between two censuses.
type Moved struct {
	Name          string
	Before, After int
	// Added are the items after that were not there before; Gone the
	// reverse.
	Added, Gone []string
}

func (m Moved) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d before, %d after", m.Name, m.Before, m.After)
	for _, s := range m.Added {
		b.WriteString("\n    + " + s)
	}
	for _, s := range m.Gone {
		b.WriteString("\n    - " + s)
	}
	return b.String()
}

// Diff lists the counts of after whose value differs from before's.
func Diff(before, after Census) []Moved {
	var out []Moved
	for _, a := range after {
		b, _ := before.Get(a.Name)
		if a.Value == b.Value {
			continue
		}
		out = append(out, Moved{
			Name: a.Name, Before: b.Value, After: a.Value,
			Added: subtract(a.Items, b.Items), Gone: subtract(b.Items, a.Items),
		})
	}
	return out
}

// subtract is the multiset a minus b, in a's order.
func subtract(a, b []string) []string {
	left := map[string]int{}
	for _, s := range b {
		left[s]++
	}
	var out []string
	for _, s := range a {
		if left[s] > 0 {
			left[s]--
			continue
		}
		out = append(out, s)
	}
	return out
}
