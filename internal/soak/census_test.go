package soak

import (
	"reflect"
	"testing"
)

func TestDiff(t *testing.T) {
	before := Census{
		{Name: "mounts", Value: 1, Items: []string{"bind /a"}},
		{Name: "flat-file links", Value: 2, Items: []string{"f nlink=2"}},
		{Name: "fds", Value: 3, Items: []string{"socket", "socket", "/log"}},
	}
	tests := []struct {
		name  string
		after Census
		want  []Moved
	}{
		{"nothing moved", before, nil},
		{"a mount left", Census{
			{Name: "mounts", Value: 2, Items: []string{"bind /a", "bind /b"}},
			before[1], before[2],
		}, []Moved{{Name: "mounts", Before: 1, After: 2, Added: []string{"bind /b"}}}},
		{"a link left on the same file", Census{
			before[0], {Name: "flat-file links", Value: 3, Items: []string{"f nlink=3"}}, before[2],
		}, []Moved{{Name: "flat-file links", Before: 2, After: 3, Added: []string{"f nlink=3"}, Gone: []string{"f nlink=2"}}}},
		{"one more of a kind", Census{
			before[0], before[1], {Name: "fds", Value: 4, Items: []string{"socket", "socket", "socket", "/log"}},
		}, []Moved{{Name: "fds", Before: 3, After: 4, Added: []string{"socket"}}}},
		{"a count new after", append(append(Census{}, before...), Count{Name: "taps", Value: 1, Items: []string{"tap x"}}),
			[]Moved{{Name: "taps", Before: 0, After: 1, Added: []string{"tap x"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Diff(before, tt.after); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Diff = %+v, want %+v", got, tt.want)
			}
		})
	}
}
