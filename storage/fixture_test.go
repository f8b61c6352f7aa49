package storage

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// copyDir copies the directory tree src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFormat5ReplicatedFixture opens a directory a format-5 build wrote
// (testdata/format5-replicated, made by GENERATED-BY.go.txt at 7d9789b):
// replica copies with three nodes, one of them acked, jobs of this node
// sent to another (NODES) and one still in wait-repl, a lone node's job, a
// dummy ack, and an AOF tail the index had not applied (two more copies,
// one acked: a kill -9). Every job reads back as that build wrote it, the
// resume set is the acked and wait-repl jobs, the index is marked format
// 6, Check finds nothing wrong, and the same holds after a restart and
// after a rebuild from the log.
func TestFormat5ReplicatedFixture(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, filepath.Join("testdata", "format5-replicated"), dir)
	raw, err := os.ReadFile(filepath.Join(dir, "jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want []struct {
		ID, Queue, State, Body string
		Nodes                  []string
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	format := func() byte {
		var v byte
		rewriteIndex(t, vfs.Default, dir, func(db *pebble.DB) {
			b, closer, err := db.Get(keyFormat)
			if err != nil {
				t.Fatal(err)
			}
			v = b[0]
			closer.Close()
		})
		return v
	}
	if f := format(); f != 5 {
		t.Fatalf("the fixture's index is format %d, want 5", f)
	}
	opts := TestingOptions()
	opts.FS, opts.Logger = vfs.Default, quietLogger()
	var resumable []string
	for _, w := range want {
		if w.State == "acked" || w.State == "wait-repl" {
			resumable = append(resumable, w.ID)
		}
	}
	slices.Sort(resumable)
	for _, step := range []string{"upgrade", "restart", "rebuild"} {
		opts.Rebuild = RebuildWhenLost
		if step == "rebuild" {
			opts.Rebuild = RebuildAlways
		}
		s, err := Open(dir, opts)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		for _, w := range want {
			j, err := s.Job(w.ID)
			if err != nil {
				t.Fatalf("%s: %s: %v", step, w.ID, err)
			}
			if j.Queue != w.Queue || j.State.String() != w.State || !slices.Equal(j.Nodes, w.Nodes) {
				t.Fatalf("%s: job %s is %s in %q on %v, want %s in %q on %v", step, w.ID, j.State, j.Queue, j.Nodes, w.State, w.Queue, w.Nodes)
			}
			if w.Body != "" {
				if body, err := s.Body(j); err != nil || string(body) != w.Body {
					t.Fatalf("%s: job %s's body %q (%v), want %q", step, w.ID, body, err, w.Body)
				}
			}
		}
		if n := s.Stats().Jobs; n != int64(len(want)) {
			t.Fatalf("%s: %d jobs, want %d", step, n, len(want))
		}
		if got := resumableIDs(t, s, 4); !slices.Equal(got, resumable) {
			t.Fatalf("%s: resume set %v, want %v", step, got, resumable)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if f := format(); f != formatVersion {
			t.Fatalf("%s: the index is format %d, want %d", step, f, formatVersion)
		}
		rep, err := Check(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Fatalf("%s: check: %v", step, rep.Problems)
		}
	}
}
