package wal

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestFailedFsyncIsRewrittenFromMemory is fsyncgate: after a failed fsync
// Linux may drop the dirty pages yet keep serving them from its cache, so
// what was written since the last good fsync may be on no disk. Under
// everysec those writes were acknowledged. The log keeps them (Unsynced), and
// an Open given them cuts the segment at its durable end and writes them
// again, so a crash afterwards loses nothing acknowledged. Under always no
// such write was acknowledged; the segment is only cut back.
func TestFailedFsyncIsRewrittenFromMemory(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncEverySec, SyncNever, SyncAlways} {
		t.Run(policy.String(), func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			var fail atomic.Bool
			opts := crashOpts(failingSyncFS(mem, &fail), policy)
			opts.SegmentSize = 1 << 20
			opts.SyncInterval = time.Hour // fsyncs only when asked
			l, err := Open(crashDir, opts)
			if err != nil {
				t.Fatal(err)
			}
			durable := appendRecs(t, l, 0, 20)
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			fail.Store(true)
			var acked []rec // written, and (unless always) acknowledged
			if policy != SyncAlways {
				acked = appendRecs(t, l, 20, 30)
				if err := l.Sync(); !errors.Is(err, ErrPoisoned) {
					t.Fatalf("sync with a failing disk: %v", err)
				}
			} else if _, _, err := l.Append(testRecord(20)); !errors.Is(err, ErrPoisoned) {
				t.Fatalf("append with a failing disk: %v", err)
			}
			select {
			case <-l.Poisoned():
			default:
				t.Fatal("Poisoned() not closed after a failed fsync")
			}
			if !errors.Is(l.Err(), errorfs.ErrInjected) {
				t.Fatalf("Err() = %v", l.Err())
			}
			l.Close()
			u := l.Unsynced()
			if u == nil || u.Synced != durable[len(durable)-1].end {
				t.Fatalf("Unsynced() = %+v, want a cut at %d", u, durable[len(durable)-1].end)
			}
			if policy == SyncAlways && u.Data != nil {
				t.Fatal("under always, unacknowledged writes were kept for a rewrite")
			}
			// The OS dropped the pages: the file holds only what was synced.
			dropped := mem.CrashClone(vfs.CrashCloneCfg{})
			ropts := crashOpts(dropped, policy)
			ropts.Rewrite = u
			l2, err := Open(crashDir, ropts)
			if err != nil {
				t.Fatal(err)
			}
			want := append(durable, acked...)
			checkLog(t, l2, 0, want)
			l2.Close()
			// And it was fsynced: a machine crash now keeps it all.
			l3, err := Open(crashDir, crashOpts(dropped.CrashClone(vfs.CrashCloneCfg{}), policy))
			if err != nil {
				t.Fatal(err)
			}
			defer l3.Close()
			checkLog(t, l3, 0, want)
		})
	}
}

// TestMaxUnsyncedBoundsWhatIsKept: the bytes kept for a rewrite are bounded;
// past MaxUnsynced the writer fsyncs even under everysec and no.
func TestMaxUnsyncedBoundsWhatIsKept(t *testing.T) {
	opts := TestingOptions()
	opts.Sync = SyncNever
	opts.SegmentSize = 1 << 20
	opts.MaxUnsynced = 8 << 10
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recs := appendRecs(t, l, 0, 400)
	if d, end := l.Durable(), recs[len(recs)-1].end; d == 0 || end-d > LSN(opts.MaxUnsynced)+2048 {
		t.Fatalf("durable %d of %d written with MaxUnsynced %d", d, end, opts.MaxUnsynced)
	}
	l.keptMu.Lock()
	kept := l.kept.n
	l.keptMu.Unlock()
	if kept > opts.MaxUnsynced+2048 {
		t.Fatalf("%d bytes kept, MaxUnsynced %d", kept, opts.MaxUnsynced)
	}
}

// TestKeptBytes checks keptBytes against a plain slice through random adds,
// drops and resets that cross block boundaries.
func TestKeptBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var k keptBytes
	var ref []byte
	from := LSN(100)
	k.reset(from)
	for step := range 800 {
		switch r := rng.IntN(10); {
		case r < 6:
			p := make([]byte, rng.IntN(keptBlockSize/2))
			for i := range p {
				p[i] = byte(step + i)
			}
			k.add(p)
			ref = append(ref, p...)
		case r < 9:
			d := rng.IntN(len(ref) + 1)
			k.dropTo(from + LSN(d))
			ref, from = ref[d:], from+LSN(d)
		default:
			from += LSN(len(ref)) + 17
			k.reset(from)
			ref = nil
		}
		if k.from != from || k.n != len(ref) {
			t.Fatalf("step %d: kept from %d n %d, want %d, %d", step, k.from, k.n, from, len(ref))
		}
		if step%50 == 0 && !bytes.Equal(k.bytes(), ref) {
			t.Fatalf("step %d: kept bytes differ", step)
		}
	}
}
