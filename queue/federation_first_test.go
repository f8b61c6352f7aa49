package queue

import (
	"testing"

	"github.com/diskque/diskque/storage"
)

// TestGivenFirst: what a giver vouches for, case by case.
func TestGivenFirst(t *testing.T) {
	self := "0123456789abcdef0123456789abcdef01234567"
	other := "fedcba9876543210fedcba9876543210fedcba98"
	id := "D-01234567-" + "abcdefghijklmnopqrstuvwx" + "-0e11"
	fg := FirstGive{Incarnation: 7, After: 1000}
	mine := func(f func(j *storage.Job)) *storage.Job {
		j := &storage.Job{ID: id, Ctime: 2000, Retry: 60, Repl: 1, Nodes: []string{self}}
		if f != nil {
			f(j)
		}
		return j
	}
	for _, tc := range []struct {
		name string
		job  *storage.Job
		fg   FirstGive
		want bool
	}{
		{"minted here after the mark, never sent", mine(nil), fg, true},
		{"no incarnation known", mine(nil), FirstGive{After: 1000}, false},
		{"minted before the mark", mine(func(j *storage.Job) { j.Ctime = 1000 }), fg, false},
		{"given before (asker in the list)", mine(func(j *storage.Job) { j.Nodes = []string{self, other} }), fg, false},
		{"replicated", mine(func(j *storage.Job) { j.Repl = 2 }), fg, false},
		{"at most once", mine(func(j *storage.Job) { j.Retry = 0 }), fg, false},
		{"another node's id", mine(func(j *storage.Job) { j.ID = "D-fedcba98-abcdefghijklmnopqrstuvwx-0e11" }), fg, false},
		{"another node's list", mine(func(j *storage.Job) { j.Nodes = []string{other} }), fg, false},
		{"no job", nil, fg, false},
	} {
		if got := givenFirst(tc.job, self, tc.fg); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
