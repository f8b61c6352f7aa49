package storage

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestWriteBufferMatchesPebble: whatever the writes, the index as the store
// reads it — the write buffer over Pebble, flushed now and then — holds the
// same keys as the same writes made straight to Pebble, for full scans,
// bounded scans in either direction and point lookups; and a key set and
// deleted within one buffer never reaches Pebble.
func TestWriteBufferMatchesPebble(t *testing.T) {
	// Keys starting with 'j' are job keys, which the buffer keeps apart.
	keys := []string{"a", "b", "ba", "bb", "c", "d", "e", "f", "fa", "g", "h", "i", "j", "ja", "jb", "jz", "k", "ka"}
	checkBufferMatchesPebble(t, keys, 300, rand.New(rand.NewPCG(1, 2)))
}

// TestWriteBufferDeletionRunsMatchPebble is TestWriteBufferMatchesPebble
// over keys shaped like two queues' and the schedule's, with runs of two
// deletions already made ranges (deletionRuns): a range never deletes a
// key Pebble holds that stays, nor one the buffer writes in the same flush.
func TestWriteBufferDeletionRunsMatchPebble(t *testing.T) {
	defer func(n int) { minDeletionRun = n }(minDeletionRun)
	minDeletionRun = 2
	var keys []string
	for i := range 6 {
		keys = append(keys, string(queueKey("qa", uint64(i), fmt.Sprintf("%040d", i))),
			string(queueKey("qb", uint64(i), fmt.Sprintf("%040d", i))),
			string(scheduleKey(int64(i/2), EventTTL, fmt.Sprintf("%040d", i))))
	}
	keys = append(keys, "j1", "j2", "p1", "r1", "r2")
	checkBufferMatchesPebble(t, keys, 100, rand.New(rand.NewPCG(3, 4)))
}

// TestWriteBufferByJobIDMatchesPebble is TestWriteBufferMatchesPebble over
// keys shaped like the store's job and schedule keys, which the buffer keeps
// by job id (several schedule keys of one id, and keys of ids that share a
// prefix), beside a queue's keys and a job key of another length.
func TestWriteBufferByJobIDMatchesPebble(t *testing.T) {
	var keys []string
	for _, id := range []string{fmt.Sprintf("%040d", 1), fmt.Sprintf("%040d", 2), fmt.Sprintf("%039d3", 0)[:39] + "4"} {
		keys = append(keys, string(jobKey(id)), string(queueKey("qa", 7, id)),
			string(scheduleKey(5, EventTTL, id)), string(scheduleKey(5, EventRetry, id)),
			string(scheduleKey(9, EventRetry, id)), string(scheduleKey(2, EventDelay, id)))
	}
	keys = append(keys, "j1", "s1", "p1")
	checkBufferMatchesPebble(t, keys, 200, rand.New(rand.NewPCG(5, 6)))
}

// TestWriteBufferOneEntryPerJobID: a job's job key and schedule keys take
// one entry of the buffer's id map, which goes with the last of them.
func TestWriteBufferOneEntryPerJobID(t *testing.T) {
	w := newWriteBuffer()
	id := fmt.Sprintf("%040d", 7)
	jk, ttl, retry := jobKey(id), scheduleKey(5, EventTTL, id), scheduleKey(9, EventRetry, id)
	mustDo(t, w.Set(jk, []byte("v"), true), w.Set(ttl, nil, true), w.Set(retry, nil, true))
	if len(w.ids) != 1 || w.jobs.n != 1 || w.sched.n != 2 {
		t.Fatalf("%d ids, %d job keys, %d schedule keys; want 1, 1, 2", len(w.ids), w.jobs.n, w.sched.n)
	}
	mustDo(t, w.Delete(jk), w.Delete(retry))
	if len(w.ids) != 1 {
		t.Fatalf("%d ids with the TTL key left, want 1", len(w.ids))
	}
	mustDo(t, w.Delete(ttl))
	if len(w.ids) != 0 || w.jobs.n != 0 || w.sched.n != 0 {
		t.Fatalf("%d ids, %d job keys, %d schedule keys left of a job created and deleted in the buffer", len(w.ids), w.jobs.n, w.sched.n)
	}
	if e, ok := w.lookup(ttl); ok {
		t.Fatalf("a dropped key reads %+v", e)
	}
}

func checkBufferMatchesPebble(t *testing.T, keys []string, rounds int, rng *rand.Rand) {
	open := func() *pebble.DB {
		db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, Logger: quietPebble{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	defer func(n int) { bufCursorChunk = n }(bufCursorChunk)
	for round := range rounds {
		bufCursorChunk = 1 + round%3 // scans cross chunk boundaries
		direct := open()
		s := &Store{db: open(), buf: newWriteBuffer()}
		s.buf.pebble = s.db // the invariants check reads it
		var log []string
		for i := range 60 {
			k := []byte(keys[rng.IntN(len(keys))])
			present := get(t, direct, k) != nil
			switch r := rng.IntN(20); {
			case r < 10:
				v := []byte(fmt.Sprintf("v%d", i))
				mustDo(t, direct.Set(k, v, pebble.NoSync), s.buf.Set(k, v, !present))
				log = append(log, fmt.Sprintf("set %s=%s", k, v))
			case r < 17:
				mustDo(t, direct.Delete(k, pebble.NoSync), s.buf.Delete(k))
				log = append(log, fmt.Sprintf("del %s", k))
			case r < 18:
				end := []byte{k[0] + byte(1+rng.IntN(3))}
				mustDo(t, direct.DeleteRange(k, end, pebble.NoSync), s.buf.DeleteRange(k, end))
				log = append(log, fmt.Sprintf("delrange %s-%s", k, end))
				// The store flushes at the end of such a commit, but reads
				// and writes before then must see the keys deleted.
				if rng.IntN(2) == 0 {
					flushBuf(t, s)
					log = append(log, "flush")
				}
			default:
				flushBuf(t, s)
				log = append(log, "flush")
			}
			want := dump(t, direct, nil, nil, false, 100)
			if got := dumpMerged(t, s, nil, nil, false, 100); got != want {
				t.Fatalf("round %d: after %q\npebble:  %s\nbuffered: %s", round, log, want, got)
			}
			lo := []byte(keys[rng.IntN(len(keys))])
			hi := []byte(keys[rng.IntN(len(keys))])
			if bytes.Compare(lo, hi) > 0 {
				lo, hi = hi, lo
			}
			if rng.IntN(4) == 0 {
				hi = nil // no upper bound
			}
			reverse, limit := rng.IntN(2) == 0, 1+rng.IntN(4)
			want = dump(t, direct, lo, hi, reverse, limit)
			if got := dumpMerged(t, s, lo, hi, reverse, limit); got != want {
				t.Fatalf("round %d: [%s, %s) reverse %v limit %d after %q\npebble:  %s\nbuffered: %s",
					round, lo, hi, reverse, limit, log, want, got)
			}
			for _, k := range keys {
				var got []byte
				if e, ok := s.buf.lookup([]byte(k)); ok {
					if !e.del {
						got = e.value
					}
				} else {
					got = get(t, s.db, []byte(k))
				}
				if w := get(t, direct, []byte(k)); !bytes.Equal(got, w) {
					t.Fatalf("round %d: %s reads %q, want %q after %q", round, k, got, w, log)
				}
			}
		}
	}
}

// TestWriteBufferCancelsShortLivedKeys: a key the buffer created and then
// deleted leaves nothing for Pebble, not even a tombstone; one that Pebble
// held leaves a tombstone.
func TestWriteBufferCancelsShortLivedKeys(t *testing.T) {
	w := newWriteBuffer()
	for _, p := range []string{"q", "j", "s"} { // the tree, and the job and schedule keys' maps
		mustDo(t, w.Set([]byte(p+"new"), []byte("1"), true), w.Set([]byte(p+"new"), []byte("2"), false), w.Delete([]byte(p+"new")))
		mustDo(t, w.Set([]byte(p+"old"), []byte("1"), false), w.Delete([]byte(p+"old")))
	}
	if w.t.Len() != 0 || len(w.dels) != 1 || w.jobs.n != 1 || w.sched.n != 1 {
		t.Fatalf("%d + %d + %d + %d entries, want only the old keys' tombstones", w.t.Len(), len(w.dels), w.jobs.n, w.sched.n)
	}
	for _, k := range []string{"qold", "jold", "sold"} {
		if e, ok := w.lookup([]byte(k)); !ok || !e.del {
			t.Fatalf("%s: %+v, %v", k, e, ok)
		}
	}
	w.reset()
	if w.t.Len() != 0 || len(w.dels) != 0 || w.jobs.n != 0 || w.sched.n != 0 || len(w.rangeDels) != 0 || w.bytes != 0 {
		t.Fatalf("reset left %d + %d + %d entries, %d bytes", w.t.Len(), len(w.dels), w.jobs.n, w.bytes)
	}
}

func mustDo(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func flushBuf(t *testing.T, s *Store) {
	t.Helper()
	b := s.db.NewBatch()
	mustDo(t, s.buf.emit(b), b.Commit(pebble.NoSync), b.Close())
	s.buf.reset()
}

func get(t *testing.T, db *pebble.DB, k []byte) []byte {
	t.Helper()
	v, closer, err := db.Get(k)
	if err == pebble.ErrNotFound {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	return bytes.Clone(v)
}

func dump(t *testing.T, db *pebble.DB, lo, hi []byte, reverse bool, limit int) string {
	t.Helper()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var out bytes.Buffer
	step, ok := it.Next, it.First()
	if reverse {
		step, ok = it.Prev, it.Last()
	}
	for n := 0; ok && n < limit; ok, n = step(), n+1 {
		fmt.Fprintf(&out, "%s=%s ", it.Key(), it.Value())
	}
	return out.String()
}

func dumpMerged(t *testing.T, s *Store, lo, hi []byte, reverse bool, limit int) string {
	t.Helper()
	var out bytes.Buffer
	n := 0
	err := s.scanMerged(lo, hi, reverse, func(k, v []byte) bool {
		fmt.Fprintf(&out, "%s=%s ", k, v)
		n++
		return n < limit
	})
	if err != nil {
		t.Fatal(err)
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

// TestWriteBufferRefusesAWrongFreshClaim: a write that claims a key is new
// while the buffer holds it fails with ErrIndexInvariant and changes
// nothing: deleting such a key later would leave no tombstone.
func TestWriteBufferRefusesAWrongFreshClaim(t *testing.T) {
	w := newWriteBuffer()
	for _, k := range []string{"qkey", "jkey"} { // the tree, and the job keys' map
		mustDo(t, w.Set([]byte(k), []byte("held"), false))
		if err := w.Set([]byte(k), []byte("claimed new"), true); !errors.Is(err, ErrIndexInvariant) {
			t.Fatalf("%s: fresh Set over a live entry: %v, want ErrIndexInvariant", k, err)
		}
		if e, ok := w.lookup([]byte(k)); !ok || e.del || string(e.value) != "held" || e.fresh {
			t.Fatalf("%s after the refused Set: %+v, %v", k, e, ok)
		}
		// Over a deletion the claim is right (the key was deleted), and the
		// entry keeps the deletion's freshness: Pebble holds the key.
		mustDo(t, w.Delete([]byte(k)), w.Set([]byte(k), []byte("again"), true))
		if e, ok := w.lookup([]byte(k)); !ok || e.fresh {
			t.Fatalf("%s set again after its deletion: %+v, %v", k, e, ok)
		}
	}
}

// TestWriteBufferChecksFreshDeletionsAgainstPebble: under invariants, the
// deletion of a key written as fresh that Pebble does hold fails loudly
// instead of dropping the key without a tombstone (which would bring
// Pebble's value back) — unless a pending range deletion covers it.
func TestWriteBufferChecksFreshDeletionsAgainstPebble(t *testing.T) {
	if !invariants {
		t.Skip("invariants are off (build with -race or -tags diskque_invariants)")
	}
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	keys := []string{"qkey", "jkey", "skey"}
	for _, k := range keys {
		mustDo(t, db.Set([]byte(k), []byte("in pebble"), pebble.NoSync))
	}
	w := newWriteBuffer()
	w.pebble = db
	for _, k := range keys[:2] {
		mustDo(t, w.Set([]byte(k), []byte("wrongly fresh"), true))
		if err := w.Delete([]byte(k)); !errors.Is(err, ErrIndexInvariant) {
			t.Fatalf("%s: deleting a wrongly fresh key: %v, want ErrIndexInvariant", k, err)
		}
		if e, ok := w.lookup([]byte(k)); !ok || e.del {
			t.Fatalf("%s after the refused Delete: %+v, %v", k, e, ok)
		}
	}
	// Covered by a pending range deletion, Pebble's key is as good as gone.
	mustDo(t, w.DeleteRange([]byte("s"), []byte("t")), w.Set([]byte("skey"), []byte("new"), true), w.Delete([]byte("skey")))
	if e, ok := w.lookup([]byte("skey")); !ok || !e.del {
		t.Fatalf("skey under a pending range deletion: %+v, %v", e, ok)
	}
}

// TestSortedEntriesIsKeyOrder: the hashed families' sort (by the 8 bytes
// after the keys' common prefix, then the whole keys) gives the order of
// the keys as strings, for job keys of one node and of several, and for
// keys of every length: shorter than the prefix plus 8, prefixes of one
// another, zero bytes where a shorter key was padded.
func TestSortedEntriesIsKeyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	node, other := NewNodeID(), NewNodeID()
	sets := map[string][]string{"empty": nil, "one": {"jx"}}
	var jobs, mixed, odd []string
	for i := range 3000 {
		jobs = append(jobs, string(jobKey(NewJobID(node, 3600, 60))))
		n := node
		if i%3 == 0 {
			n = other
		}
		mixed = append(mixed, string(jobKey(NewJobID(n, int64(1+i%7), 60))))
	}
	for range 3000 {
		k := make([]byte, 1+rng.IntN(14))
		for i := range k {
			k[i] = "j\x00\x01ab"[rng.IntN(5)]
		}
		odd = append(odd, "j"+string(k))
	}
	odd = append(odd, "j", "jab", "jab\x00", "jab\x00\x00\x00\x00\x00\x00\x00\x00", "jab\x00\x00\x00\x00\x00\x00\x00\x00\x01")
	sets["jobs"], sets["two nodes"], sets["odd"] = jobs, mixed, odd
	for name, keys := range sets {
		m := map[string]*bufEntry{}
		for _, k := range keys {
			m[k] = &bufEntry{key: k}
		}
		var got []string
		for _, e := range sortedOf(m) {
			got = append(got, e.key)
		}
		want := slices.Sorted(maps.Keys(m))
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %d keys out of order", name, len(want))
		}
	}
}

// sortedOf returns m's entries sorted as a flush sorts a family's.
func sortedOf(m map[string]*bufEntry) []*bufEntry {
	es := slices.Collect(maps.Values(m))
	sortEntries(es)
	return es
}

// BenchmarkSortedEntries: a flush's sort of the job keys of 5,000 ids of
// one node (a 2 MiB buffer's worth in the federation drain).
func BenchmarkSortedEntries(b *testing.B) {
	node := NewNodeID()
	m := map[string]*bufEntry{}
	for range 5000 {
		k := string(jobKey(NewJobID(node, 3600, 60)))
		m[k] = &bufEntry{key: k}
	}
	for b.Loop() {
		sortedOf(m)
	}
}
