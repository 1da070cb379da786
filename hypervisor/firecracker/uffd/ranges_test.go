package uffd

import (
	"slices"
	"testing"
)

func TestRangeSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  []span
		want []span
	}{
		{"empty span ignored", []span{{5, 5}}, nil},
		{"disjoint kept sorted", []span{{20, 30}, {0, 10}}, []span{{0, 10}, {20, 30}}},
		{"adjacent merge", []span{{0, 10}, {10, 20}}, []span{{0, 20}}},
		{"overlap merge", []span{{0, 10}, {5, 15}}, []span{{0, 15}}},
		{"bridge merges three", []span{{0, 10}, {20, 30}, {40, 50}, {5, 45}}, []span{{0, 50}}},
		{"contained", []span{{0, 100}, {10, 20}}, []span{{0, 100}}},
		{"insert between", []span{{0, 10}, {40, 50}, {20, 30}}, []span{{0, 10}, {20, 30}, {40, 50}}},
	} {
		var r rangeSet
		for _, s := range tc.add {
			r.add(s.start, s.end)
		}
		if !slices.Equal(r.spans, tc.want) {
			t.Errorf("%s: spans %v, want %v", tc.name, r.spans, tc.want)
		}
	}
}

func TestRangeSetIntersects(t *testing.T) {
	var r rangeSet
	r.add(10, 20)
	r.add(30, 40)
	for _, tc := range []struct {
		start, end uint64
		want       bool
	}{
		{0, 10, false},
		{0, 11, true},
		{19, 20, true},
		{20, 30, false},
		{25, 35, true},
		{40, 50, false},
		{0, 100, true},
	} {
		if got := r.intersects(tc.start, tc.end); got != tc.want {
			t.Errorf("intersects(%d, %d) = %v, want %v", tc.start, tc.end, got, tc.want)
		}
	}
}
