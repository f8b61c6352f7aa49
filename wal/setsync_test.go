package wal

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// crashedRecords opens a crash clone of mem (what a machine crash now
// would leave) and counts its records.
func crashedRecords(t *testing.T, mem *vfs.MemFS) int {
	t.Helper()
	l, err := Open(crashDir, crashOpts(mem.CrashClone(vfs.CrashCloneCfg{}), SyncNever))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := 0
	if err := l.Replay(0, func(LSN, LSN, Record) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSetSyncSwitchesPolicyWhileRunning walks a running log through every
// switch of policy (in a synctest bubble, so that "a second later" is
// exact): no fsyncs nothing by itself; everysec fsyncs within a second; a
// switch away from everysec makes what it owed durable at once; under
// always every Append returns durable, the ones before the switch included.
func TestSetSyncSwitchesPolicyWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := vfs.NewCrashableMem()
		opts := crashOpts(mem, SyncNever)
		opts.SegmentSize = 1 << 20
		opts.SyncInterval = time.Second
		l, err := Open(crashDir, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		end := func(rs []rec) LSN { return rs[len(rs)-1].end }

		recs := appendRecs(t, l, 0, 5)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if d := l.Durable(); d >= end(recs) {
			t.Fatalf("under no, durable %d of %d without an fsync asked for", d, end(recs))
		}

		if err := l.SetSync(SyncEverySec); err != nil {
			t.Fatal(err)
		}
		if got := l.SyncPolicy(); got != SyncEverySec {
			t.Fatalf("SyncPolicy() = %v after SetSync(everysec)", got)
		}
		time.Sleep(opts.SyncInterval + opts.SyncInterval/2)
		synctest.Wait()
		if d := l.Durable(); d < end(recs) {
			t.Fatalf("a second and a half after the switch to everysec, durable %d of %d", d, end(recs))
		}
		if n := crashedRecords(t, mem); n != 5 {
			t.Fatalf("a crash after everysec's fsync keeps %d records, want 5", n)
		}

		recs = append(recs, appendRecs(t, l, 5, 5)...)
		if err := l.SetSync(SyncNever); err != nil {
			t.Fatal(err)
		}
		if d := l.Durable(); d < end(recs) {
			t.Fatalf("after the switch from everysec to no, durable %d of %d: the owed fsync was dropped", d, end(recs))
		}
		if n := crashedRecords(t, mem); n != 10 {
			t.Fatalf("a crash after the switch to no keeps %d records, want 10", n)
		}

		recs = append(recs, appendRecs(t, l, 10, 5)...)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if d := l.Durable(); d >= end(recs) {
			t.Fatalf("under no again, durable %d of %d: the everysec loop still fsyncs", d, end(recs))
		}
		if err := l.SetSync(SyncAlways); err != nil {
			t.Fatal(err)
		}
		if d := l.Durable(); d < end(recs) {
			t.Fatalf("after the switch to always, durable %d of %d: acknowledged records are not on disk", d, end(recs))
		}
		for i := 15; i < 20; i++ {
			_, e, err := l.Append(testRecord(i))
			if err != nil {
				t.Fatal(err)
			}
			if d := l.Durable(); d < e {
				t.Fatalf("under always, Append returned with durable %d < %d", d, e)
			}
			if n := crashedRecords(t, mem); n != i+1 {
				t.Fatalf("a crash after Append %d under always keeps %d records", i, n)
			}
		}

		if err := l.SetSync(SyncEverySec); err != nil {
			t.Fatal(err)
		}
		recs = appendRecs(t, l, 20, 1)
		if d := l.Durable(); d >= end(recs) {
			t.Fatalf("back under everysec, Append waited for an fsync (durable %d, end %d)", d, end(recs))
		}
		if err := l.SetSync(SyncPolicy(9)); err == nil || l.SyncPolicy() != SyncEverySec {
			t.Fatalf("SetSync(9) = %v, policy now %v", err, l.SyncPolicy())
		}
	})
}

// failingSyncFS wraps mem so that segment fsyncs fail while fail is set.
func failingSyncFS(mem *vfs.MemFS, fail *atomic.Bool) vfs.FS {
	return errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileSync && strings.HasSuffix(op.Path, segmentSuffix) && fail.Load() {
			return errorfs.ErrInjected
		}
		return nil
	}))
}

// TestSetSyncToAlwaysKeepsEverySecWritesOnFailedFsync: records acknowledged
// under everysec and not yet fsynced are still kept for a rewrite when the
// fsync of the switch to always fails (fsyncgate), though the policy is now
// always; a record written under always whose fsync failed is not.
func TestSetSyncToAlwaysKeepsEverySecWritesOnFailedFsync(t *testing.T) {
	t.Run("acknowledged under everysec", func(t *testing.T) {
		mem := vfs.NewCrashableMem()
		var fail atomic.Bool
		opts := crashOpts(failingSyncFS(mem, &fail), SyncEverySec)
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
		acked := appendRecs(t, l, 20, 10)
		if err := l.SetSync(SyncAlways); !errors.Is(err, ErrPoisoned) {
			t.Fatalf("SetSync(always) with a failing disk: %v", err)
		}
		if l.SyncPolicy() != SyncAlways {
			t.Fatalf("policy %v after a SetSync(always) whose fsync failed", l.SyncPolicy())
		}
		l.Close()
		u := l.Unsynced()
		if u == nil || u.Data == nil {
			t.Fatalf("Unsynced() = %+v: the writes acknowledged under everysec were not kept", u)
		}
		ropts := crashOpts(mem.CrashClone(vfs.CrashCloneCfg{}), SyncAlways)
		ropts.Rewrite = u
		l2, err := Open(crashDir, ropts)
		if err != nil {
			t.Fatal(err)
		}
		defer l2.Close()
		checkLog(t, l2, 0, append(durable, acked...))
	})
	t.Run("written under always", func(t *testing.T) {
		mem := vfs.NewCrashableMem()
		var fail atomic.Bool
		opts := crashOpts(failingSyncFS(mem, &fail), SyncEverySec)
		opts.SegmentSize = 1 << 20
		opts.SyncInterval = time.Hour
		l, err := Open(crashDir, opts)
		if err != nil {
			t.Fatal(err)
		}
		acked := appendRecs(t, l, 0, 20)
		if err := l.SetSync(SyncAlways); err != nil {
			t.Fatal(err)
		}
		fail.Store(true)
		if _, _, err := l.Append(testRecord(20)); !errors.Is(err, ErrPoisoned) {
			t.Fatalf("append under always with a failing disk: %v", err)
		}
		l.Close()
		if u := l.Unsynced(); u == nil || u.Data != nil {
			t.Fatalf("Unsynced() = %+v: want a cut and nothing to write again", u)
		}
		l2, err := Open(crashDir, crashOpts(mem.CrashClone(vfs.CrashCloneCfg{}), SyncAlways))
		if err != nil {
			t.Fatal(err)
		}
		defer l2.Close()
		checkLog(t, l2, 0, acked)
	})
}

// TestSetSyncUnderConcurrentAppends switches the policy again and again
// while appenders run: once a switch to always has returned, every record
// acknowledged before it is durable, and every Append that starts after it
// (with no switch since) returns durable.
func TestSetSyncUnderConcurrentAppends(t *testing.T) {
	opts := TestingOptions()
	opts.Sync = SyncEverySec
	opts.SyncInterval = time.Hour // what everysec acknowledged stays unsynced
	opts.SegmentSize = 16 << 10   // rolls under the switches too
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var (
		acked  atomic.Uint64 // the highest end an Append returned
		gen    atomic.Int64  // bumped before every switch (after always is cleared)
		always atomic.Bool   // the last switch, which returned, was to always
		stop   atomic.Bool
		done   = make(chan struct{})
	)
	const writers = 4
	defer func() { // before l.Close, on every path
		stop.Store(true)
		for range writers {
			<-done
		}
	}()
	for w := range writers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; !stop.Load(); i++ {
				g, a := gen.Load(), always.Load()
				_, end, err := l.Append(testRecord(w*100000 + i))
				if err != nil {
					t.Error(err)
					return
				}
				for {
					old := acked.Load()
					if uint64(end) <= old || acked.CompareAndSwap(old, uint64(end)) {
						break
					}
				}
				if a && gen.Load() == g {
					if d := l.Durable(); d < end {
						t.Errorf("an Append begun under always returned with durable %d < %d", d, end)
						return
					}
				}
			}
		}()
	}
	policies := []SyncPolicy{SyncAlways, SyncNever, SyncAlways, SyncEverySec}
	for i := 0; i < 200 && !t.Failed(); i++ {
		p := policies[i%len(policies)]
		before := LSN(acked.Load())
		always.Store(false) // before gen: an appender that saw always true saw the old gen
		gen.Add(1)
		if err := l.SetSync(p); err != nil {
			t.Fatal(err)
		}
		if p == SyncAlways {
			always.Store(true)
			if d := l.Durable(); d < before {
				t.Fatalf("after a switch to always, durable %d < %d acknowledged before it", d, before)
			}
		}
		// Let the appenders run under this policy for a few records.
		from := acked.Load()
		deadline := time.Now().Add(10 * time.Second)
		for acked.Load() < from+1024 && !t.Failed() {
			if time.Now().After(deadline) {
				t.Fatal("the appenders made no progress")
			}
			time.Sleep(50 * time.Microsecond) // poll interval
		}
	}
}
