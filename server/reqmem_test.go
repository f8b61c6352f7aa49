package server

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// newDiskBroker runs a broker over a store in a real directory.
func newDiskBroker(t *testing.T) *queue.Broker {
	t.Helper()
	opts := storage.TestingOptions()
	opts.FS = vfs.Default
	return runBroker(t, filepath.Join(t.TempDir(), "data"), opts)
}

// infoInt reads one integer field of INFO memory (-1 when it is missing).
func infoInt(rc *respConn, field string) int64 {
	rc.t.Helper()
	v := infoField(rc, "memory", field)
	if v == "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		rc.t.Fatalf("INFO %s: %q", field, v)
	}
	return n
}

// liveHeapNow is the test process's live heap after a collection.
func liveHeapNow() int64 {
	runtime.GC()
	return liveHeap()
}

// addJobHead is the start of an ADDJOB whose body is n bytes long, up to
// the body.
func addJobHead(n int) string {
	return fmt.Sprintf("*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$%d\r\n", n)
}

// addJobTail ends an ADDJOB begun by addJobHead.
const addJobTail = "\r\n$1\r\n0\r\n"

// Clients that announce large bodies and send them slowly hold at most the
// budget: the bodies beyond it wait unread (the server holds none of their
// bytes), a finished body makes room for a waiting one, and everything is
// released as soon as the clients go. redcon alone buffered every partial
// body (in a buffer of twice its size).
func TestRequestBodiesHeldWithinBudget(t *testing.T) {
	const (
		bodyLen = 3 << 20
		sent    = bodyLen - 512<<10 // each client stops short of its body
		clients = 6
		budget  = 8 << 20 // room for two bodies, not three
		charged = bodyLen + 2
	)
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{MaxJobSize: 4 << 20, RequestBudget: budget, BodyWait: time.Minute})
	s.SetBroker(newDiskBroker(t))
	admin := dialResp(t, addr)
	if got := admin.do("PING"); got != "+PONG" {
		t.Fatalf("PING: %q", got)
	}
	part := []byte(addJobHead(bodyLen) + strings.Repeat("x", sent)) // one copy, made before base
	var cs []*respConn
	for range clients {
		cs = append(cs, dialResp(t, addr))
	}
	base := liveHeapNow()
	for _, c := range cs {
		go func() { _, _ = c.c.Write(part) }() // blocks while the server does not read
	}
	// Two bodies are read, four wait; what the server holds for the
	// requests stays under the budget all along.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if grown := liveHeapNow() - base; grown > budget+2<<20 {
			t.Fatalf("the heap grew by %d bytes with %d partial bodies of %d bytes (budget %d)", grown, clients, bodyLen, budget)
		}
		held, waiting := infoInt(admin, "used_memory_requests"), infoInt(admin, "request_bodies_waiting")
		if held > budget {
			t.Fatalf("used_memory_requests %d over the budget %d", held, budget)
		}
		if held == 2*charged && waiting == clients-2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("used_memory_requests %d, request_bodies_waiting %d; want %d and %d", held, waiting, 2*charged, clients-2)
		}
		time.Sleep(20 * time.Millisecond) // polling INFO, not synchronising
	}
	if used := infoInt(admin, "used_memory"); used < 2*charged {
		t.Errorf("used_memory %d does not count the %d request bytes held", used, 2*charged)
	}

	// Finished bodies make room for those that waited: finish them all
	// and every job gets in, the budget held all along.
	for _, c := range cs {
		go func() { _, _ = c.c.Write([]byte(strings.Repeat("x", bodyLen-sent) + addJobTail)) }()
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		held, waiting := infoInt(admin, "used_memory_requests"), infoInt(admin, "request_bodies_waiting")
		if held > budget {
			t.Fatalf("used_memory_requests %d over the budget %d", held, budget)
		}
		if got := admin.do("QLEN q"); got == fmt.Sprintf(":%d", clients) && held == 0 && waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QLEN %s, used_memory_requests %d, waiting %d: want every job in and nothing held", admin.do("QLEN q"), held, waiting)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, c := range cs {
		if got := c.read(); !strings.HasPrefix(got, "+D-") {
			t.Errorf("client %d: ADDJOB %q", i, got)
		}
	}
}

// A body that finds no room within BodyWait is read and dropped, and its
// command gets -OOM; nothing is added, and the connection goes on.
func TestRequestBodyRefusedWhenNoRoom(t *testing.T) {
	const bodyLen = 3 << 20
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{MaxJobSize: 4 << 20, RequestBudget: 4 << 20, BodyWait: 200 * time.Millisecond})
	s.SetBroker(newDiskBroker(t))
	admin := dialResp(t, addr)

	holder := dialResp(t, addr)
	holder.send(addJobHead(bodyLen) + "xx")
	deadline := time.Now().Add(10 * time.Second)
	// (A server that does not report it cannot be waited for: go on.)
	for held := infoInt(admin, "used_memory_requests"); held != bodyLen+2 && held != -1; held = infoInt(admin, "used_memory_requests") {
		if time.Now().After(deadline) {
			t.Fatalf("the first body is not held: used_memory_requests %d", infoInt(admin, "used_memory_requests"))
		}
		time.Sleep(10 * time.Millisecond)
	}

	late := dialResp(t, addr)
	whole := addJobHead(bodyLen) + strings.Repeat("y", bodyLen) + addJobTail
	go func() { _, _ = late.c.Write([]byte(whole + "PING\r\n")) }()
	if got := late.read(); !strings.HasPrefix(got, "-OOM request bodies") {
		t.Fatalf("ADDJOB with no room: %q", got)
	}
	if got := late.read(); got != "+PONG" {
		t.Fatalf("the connection after a refused body: %q", got)
	}
	if got := admin.do("QLEN q"); got != ":0" {
		t.Errorf("QLEN after the refusal: %q", got)
	}

	holder.send(strings.Repeat("x", bodyLen-2) + addJobTail)
	if got := holder.read(); !strings.HasPrefix(got, "+D-") {
		t.Fatalf("ADDJOB of the body that had room: %q", got)
	}
	if got := infoInt(admin, "used_memory_requests"); got != 0 {
		t.Errorf("used_memory_requests after the commands ran: %d", got)
	}
}

// -OOM follows the live heap: clients holding large partial bodies trip
// it, and it lifts as soon as they are gone — without waiting for the
// runtime to give pages back to the OS (RSS), or for a collection that an
// idle server would run only two minutes later.
func TestOOMLiftsWhenRequestMemoryIsFreed(t *testing.T) {
	const (
		bodyLen = 7 << 20
		clients = 4
	)
	base := liveHeapNow()
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{
		MaxJobSize: 8 << 20, MaxMemory: base + 24<<20, RequestBudget: 64 << 20, GuardInterval: 20 * time.Millisecond,
	})
	s.SetBroker(newDiskBroker(t))
	admin := dialResp(t, addr)
	// The guard measures the heap as it is now, not the process's RSS
	// (which is well over base + 24 MiB in a test binary).
	addJob := func() string { return admin.do("ADDJOB q small 0") }
	waitFor := func(what string, ok func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := addJob()
			if ok(got) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: ADDJOB still %q (used_memory %d, maxmemory %d)", what, got, infoInt(admin, "used_memory"), base+24<<20)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("before the load", func(got string) bool { return strings.HasPrefix(got, "+D-") })

	var cs []*respConn
	for range clients {
		c := dialResp(t, addr)
		c.send(addJobHead(bodyLen) + strings.Repeat("x", bodyLen-1<<20))
		cs = append(cs, c)
	}
	waitFor("with the bodies held", func(got string) bool { return strings.HasPrefix(got, "-OOM") })

	start := time.Now()
	for _, c := range cs {
		c.c.Close()
	}
	waitFor("after the clients closed", func(got string) bool { return strings.HasPrefix(got, "+D-") })
	t.Logf("-OOM lifted %v after the clients closed", time.Since(start).Round(time.Millisecond))
	if got := infoInt(admin, "used_memory_requests"); got != 0 {
		t.Errorf("used_memory_requests after the clients closed: %d", got)
	}
}

// Large bodies read outside redcon come back byte for byte, in a pipeline
// beside small commands, split at any point across reads.
func TestLargeBodiesPipelined(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{})
	s.SetBroker(newDiskBroker(t))
	c := dialResp(t, addr)
	var raw strings.Builder
	var bodies []string
	for i := range 3 {
		b := strings.Repeat(string(rune('a'+i)), absorbMin+i*1000) + "\r\n$3\r\n"
		bodies = append(bodies, b)
		raw.WriteString(addJobHead(len(b)) + b + addJobTail)
		raw.WriteString("ADDJOB q small 0\r\n")
	}
	raw.WriteString("GETJOB COUNT 6 FROM q\r\n")
	// Written in uneven pieces, so that headers and bodies straddle reads.
	go func() {
		data := []byte(raw.String())
		for len(data) > 0 {
			n := min(len(data), 7919)
			if _, err := c.c.Write(data[:n]); err != nil {
				return
			}
			data = data[n:]
		}
	}()
	for i := range 6 {
		if got := c.read(); !strings.HasPrefix(got, "+D-") {
			t.Fatalf("ADDJOB %d: %q", i, got)
		}
	}
	got := c.read()
	for i, b := range bodies {
		if !strings.Contains(got, " $"+b+"]") {
			t.Errorf("body %d (%d bytes) not delivered as sent", i, len(b))
		}
	}
	if n := strings.Count(got, " $small]"); n != 3 {
		t.Errorf("%d small bodies delivered, want 3", n)
	}
}
