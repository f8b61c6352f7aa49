package server

import (
	"strings"
	"testing"
	"time"
)

// TestSetMaxMemoryAppliesAtOnce: the guard measures when maxmemory is
// set, not only at its next tick (an hour away here): a tiny maxmemory
// (Disque's tests set 1 byte and 3 MB; this process's live heap may be below
// 3 MB, so 64 KiB here) refuses the very next ADDJOB with
// -OOM, everything else is served, and raising it or turning it off lets
// the very next ADDJOB in.
func TestSetMaxMemoryAppliesAtOnce(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{GuardInterval: time.Hour})
	s.SetBroker(newBroker(t))
	rc := dialResp(t, addr)
	id := rc.do("ADDJOB q before 0")
	if !strings.HasPrefix(id, "+D-") {
		t.Fatalf("ADDJOB = %q", id)
	}
	id = id[1:]
	for _, limit := range []int64{1, 64 << 10} {
		s.SetMaxMemory(limit)
		if got := rc.do("ADDJOB q x 0"); got != "-"+errOOM {
			t.Fatalf("ADDJOB right after maxmemory %d = %q, want -OOM", limit, got)
		}
	}
	if got := rc.do("QLEN q"); got != ":1" {
		t.Fatalf("QLEN over maxmemory = %q (a refused ADDJOB added a job?)", got)
	}
	if got := rc.do("SHOW " + id); !strings.HasPrefix(got, "*[") {
		t.Fatalf("SHOW over maxmemory = %q", got)
	}
	if got := rc.do("GETJOB NOHANG FROM q"); !strings.Contains(got, id) {
		t.Fatalf("GETJOB over maxmemory = %q", got)
	}
	if got := rc.do("ACKJOB " + id); got != ":1" {
		t.Fatalf("ACKJOB over maxmemory = %q", got)
	}
	if got := rc.do("INFO memory"); !strings.Contains(got, "used_memory:") {
		t.Fatalf("INFO over maxmemory = %q", got)
	}
	s.SetMaxMemory(1 << 40)
	if got := rc.do("ADDJOB q after 0"); !strings.HasPrefix(got, "+D-") {
		t.Fatalf("ADDJOB right after raising maxmemory = %q", got)
	}
	s.SetMaxMemory(1)
	if got := rc.do("ADDJOB q x 0"); got != "-"+errOOM {
		t.Fatalf("ADDJOB over maxmemory again = %q", got)
	}
	s.SetMaxMemory(0)
	if got := rc.do("ADDJOB q off 0"); !strings.HasPrefix(got, "+D-") {
		t.Fatalf("ADDJOB right after maxmemory 0 = %q", got)
	}
}

// TestInfoPersistenceFollowsSetPersistence: aof_fsync is the policy in
// effect and aof_enabled_after_restart what a restart will do, while
// aof_enabled and aof_state stay what this run does.
func TestInfoPersistenceFollowsSetPersistence(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{Info: InfoSource{AOFEnabled: true, AppendFsync: "everysec"}})
	s.SetBroker(newBroker(t))
	rc := dialResp(t, addr)
	field := func(name string) string {
		t.Helper()
		v := infoField(rc, "persistence", name)
		if v == "" {
			t.Fatalf("INFO persistence has no %s", name)
		}
		return v
	}
	if f, r := field("aof_fsync"), field("aof_enabled_after_restart"); f != "everysec" || r != "1" {
		t.Fatalf("at start: aof_fsync %s, aof_enabled_after_restart %s", f, r)
	}
	s.SetPersistence("always", false)
	if f, r := field("aof_fsync"), field("aof_enabled_after_restart"); f != "always" || r != "0" {
		t.Fatalf("after SetPersistence(always, false): aof_fsync %s, aof_enabled_after_restart %s", f, r)
	}
	if e, st := field("aof_enabled"), field("aof_state"); e != "1" || st != "on" {
		t.Fatalf("aof_enabled %s, aof_state %s: this run still writes the AOF", e, st)
	}
}
