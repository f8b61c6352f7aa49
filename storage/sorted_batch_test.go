package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSortedBatchMatchesPebbleBatch: whatever the writes, a sortedBatch
// emitted into a Pebble batch leaves the same keys as the same writes made
// to a Pebble batch directly, in order (the last write of a key wins, and a
// range deletion covers exactly the writes before it).
func TestSortedBatchMatchesPebbleBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	open := func() *pebble.DB {
		db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, Logger: quietPebble{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	key := func() []byte { return []byte{byte('a' + rng.IntN(12))} }
	for round := range 500 {
		direct, viaSorted := open(), open()
		// Keys that exist before the batch, so that deletions matter.
		for _, db := range []*pebble.DB{direct, viaSorted} {
			for k := byte('a'); k < 'a'+12; k += 2 {
				if err := db.Set([]byte{k}, []byte("old"), pebble.NoSync); err != nil {
					t.Fatal(err)
				}
			}
		}
		pb := direct.NewBatch()
		var sb sortedBatch
		sb.reset()
		var log []string
		for i := range 1 + rng.IntN(30) {
			k := key()
			var err1, err2 error
			switch r := rng.IntN(10); {
			case r < 6:
				v := []byte(fmt.Sprintf("v%d", i))
				err1, err2 = pb.Set(k, v, nil), sb.Set(k, v, nil)
				log = append(log, fmt.Sprintf("set %s=%s", k, v))
			case r < 9:
				err1, err2 = pb.Delete(k, nil), sb.Delete(k, nil)
				log = append(log, fmt.Sprintf("del %s", k))
			default:
				end := []byte{k[0] + byte(1+rng.IntN(4))}
				err1, err2 = pb.DeleteRange(k, end, nil), sb.DeleteRange(k, end, nil)
				log = append(log, fmt.Sprintf("delrange %s-%s", k, end))
			}
			if err := errors.Join(err1, err2); err != nil {
				t.Fatal(err)
			}
		}
		if err := pb.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		sorted := viaSorted.NewBatch()
		if err := sb.emit(sorted); err != nil {
			t.Fatal(err)
		}
		if sorted.Count() > pb.Count() {
			t.Fatalf("round %d: the sorted batch has %d writes, more than the %d made", round, sorted.Count(), pb.Count())
		}
		if err := sorted.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		if a, b := dump(t, direct), dump(t, viaSorted); a != b {
			t.Fatalf("round %d: after %q\ndirect: %s\nsorted: %s", round, log, a, b)
		}
	}
}

func dump(t *testing.T, db *pebble.DB) string {
	t.Helper()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var out bytes.Buffer
	for ok := it.First(); ok; ok = it.Next() {
		fmt.Fprintf(&out, "%s=%s ", it.Key(), it.Value())
	}
	return out.String()
}

// quietPebble drops the logs of Pebble instances a test opens directly.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
