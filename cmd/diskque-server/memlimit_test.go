package main

import (
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

func TestMemLimitFloor(t *testing.T) {
	for _, c := range []struct {
		name            string
		clustered       bool
		maxMemory, pebb int64
		want            int64
	}{
		{"lone", false, 0, 0, memLimitLone},
		{"clustered", true, 0, 0, memLimitClustered},
		{"maxmemory under the floor", false, 32 << 20, 0, memLimitLone},
		{"maxmemory over the floor", true, 512 << 20, 0, 512 << 20},
		{"pebble in the Go heap", false, 0, 96 << 20, memLimitLone + 96<<20},
	} {
		if got := memLimitFloor(c.clustered, c.maxMemory, c.pebb); got != c.want {
			t.Errorf("%s: memLimitFloor(%v, %d, %d) = %d, want %d", c.name, c.clustered, c.maxMemory, c.pebb, got, c.want)
		}
	}
}

func TestMemLimitNeverUnderTwiceLive(t *testing.T) {
	const floor = 96 << 20
	for _, live := range []int64{0, 10 << 20, 48 << 20, 49 << 20, 200 << 20, 4 << 30} {
		got := memLimitFor(live, floor)
		if got < floor || got < 2*live {
			t.Errorf("memLimitFor(%d) = %d: under the floor or twice the live heap", live, got)
		}
		if got != floor && got != 2*live {
			t.Errorf("memLimitFor(%d) = %d: neither the floor nor twice live", live, got)
		}
	}
}

// TestMemLimitTunerFollowsLiveHeap: the tuner raises the limit as the live
// heap grows past half the floor (no GC without end under a fixed limit),
// and follows a floor raised by CONFIG SET maxmemory, retuning only on a
// change of more than 1/16.
func TestMemLimitTunerFollowsLiveHeap(t *testing.T) {
	runtime.GC()            // the live heap is measured by a collection
	floor := int64(1 << 10) // far under this test binary's live heap
	tu := newMemLimitTuner(func() int64 { return floor })
	var set []int64
	tu.set = func(n int64) int64 { set = append(set, n); return 0 }
	first := tu.retune()
	if len(set) != 1 || first <= floor {
		t.Fatalf("first retune set %v (limit %d): want one call above the floor %d (twice the live heap)", set, first, floor)
	}
	tu.retune()
	if len(set) != 1 {
		t.Fatalf("an unchanged live heap retuned again: %v", set)
	}
	floor = 64 * first
	if got := tu.retune(); got != floor || len(set) != 2 {
		t.Fatalf("after the floor rose to %d: limit %d, calls %v", floor, got, set)
	}
}

// TestDaemonSetsMemoryLimit: the daemon as built, started without
// GOMEMLIMIT, logs the limit it set (the floor: its live heap is small),
// and leaves a GOMEMLIMIT from the environment alone.
func TestDaemonSetsMemoryLimit(t *testing.T) {
	var pebble int64
	if pebbleInGoHeap {
		o := storage.DefaultOptions()
		pebble = o.CacheSize + 2*int64(o.MemTableSize)
	}
	for _, c := range []struct {
		env, want string
	}{
		{"", `msg="memory limit" limit=` + strconv.FormatInt(memLimitFloor(false, 0, pebble), 10)},
		{"GOMEMLIMIT=300MiB", `msg="memory limit from GOMEMLIMIT" limit=300MiB`},
	} {
		port := freePort(t)
		cmd := exec.Command(serverBin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", t.TempDir(),
			"--cluster-bus-port", "0")
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMEMLIMIT=") })
		if c.env != "" {
			cmd.Env = append(cmd.Env, c.env)
		}
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		err := waitReady(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited, readyTimeout)
		_ = cmd.Process.Kill()
		<-exited
		if err != nil {
			t.Fatalf("env %q: not ready: %v\n%s", c.env, err, out.String())
		}
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("env %q: log lacks %q:\n%s", c.env, c.want, out.String())
		}
	}
}

// TestClusteredNodeLowersMemoryLimit: once a node has a peer, its limit's
// floor is memLimitClustered (its live heap is small here, so the limit is
// the floor), and the change is logged at debug level.
func TestClusteredNodeLowersMemoryLimit(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOMEMLIMIT in the environment: the daemon leaves the limit alone")
	}
	var pebble int64
	if pebbleInGoHeap {
		o := storage.DefaultOptions()
		pebble = o.CacheSize + 2*int64(o.MemTableSize)
	}
	pc := startProcCluster(t, 2, "--loglevel", "debug")
	lone := `msg="memory limit" limit=` + strconv.FormatInt(memLimitFloor(false, 0, pebble), 10)
	want := `msg="memory limit" limit=` + strconv.FormatInt(memLimitFloor(true, 0, pebble), 10)
	log := func() string { n := pc.nodes[0]; return n.logs[len(n.logs)-1].String() }
	if !strings.Contains(log(), lone) {
		t.Fatalf("node 0 did not start at the lone floor (%q):\n%s", lone, log())
	}
	deadline := time.Now().Add(clusterWait)
	for !strings.Contains(log(), want) {
		if time.Now().After(deadline) {
			var lines []string
			for _, l := range strings.Split(log(), "\n") {
				if strings.Contains(l, "memory limit") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("node 0 did not log the clustered floor %q; its memory limit lines:\n%s", want, strings.Join(lines, "\n"))
		}
		time.Sleep(10 * time.Millisecond) // polling the log, with a deadline
	}
}

var idleSink [][]byte

// TestIdleNodeReleasesHeap: after a burst leaves more than idleExcess of
// garbage, the first quiet tick frees the heap once; a busy tick does not,
// and neither does a quiet tick with nothing to give back.
func TestIdleNodeReleasesHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // the garbage stays until the tuner collects it
	frees := 0
	tu := newMemLimitTuner(func() int64 { return memLimitLone })
	tu.free = func() { frees++; debug.FreeOSMemory() }
	if tu.releaseIfIdle() {
		t.Fatal("the first call released: it has no allocation count to compare with")
	}
	burst := func() {
		for range 64 {
			idleSink = append(idleSink, make([]byte, 1<<20))
		}
		idleSink = nil // 64 MiB of garbage
	}
	burst()
	if tu.releaseIfIdle() || frees != 0 {
		t.Fatalf("released while busy (64 MiB allocated since the last tick), frees %d", frees)
	}
	if !tu.releaseIfIdle() || frees != 1 {
		t.Fatalf("quiet tick after a burst: released %v times, want once", frees)
	}
	if tu.releaseIfIdle() || frees != 1 {
		t.Fatalf("released again with nothing to give back: %d frees", frees)
	}
	burst()
	tu.releaseIfIdle()
	if !tu.releaseIfIdle() || frees != 2 {
		t.Fatalf("second burst: %d frees, want 2", frees)
	}
}
