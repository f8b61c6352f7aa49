package server

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestGuardRefusesNewJobsAndLifts: below min-free-disk ADDJOB gets -NOSPACE
// while GETJOB still serves; when space comes back, ADDJOB works again. Over
// maxmemory ADDJOB gets -OOM.
func TestGuardRefusesNewJobsAndLifts(t *testing.T) {
	fs := vfs.NewMem()
	fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 30, TotalBytes: 2 << 30})
	b := newBrokerOn(t, fs)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{MinFreeDisk: 64 << 20, GuardInterval: 2 * time.Millisecond})
	s.SetBroker(b)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() { s.Close(); <-done })
	addr := ln.Addr().String()

	if got := roundTrip(t, addr, "ADDJOB q before 0\r\n", 1); !strings.HasPrefix(got[0], "+D-") {
		t.Fatalf("with space: %q", got)
	}
	waitFor := func(what, cmd, prefix string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := roundTrip(t, addr, cmd, 1)
			if strings.HasPrefix(got[0], prefix) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: last reply %q", what, got)
			}
			time.Sleep(time.Millisecond)
		}
	}
	fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 20, TotalBytes: 2 << 30})
	waitFor("disk nearly full", "ADDJOB probe x 0\r\n", "-NOSPACE ")
	if got := roundTrip(t, addr, "GETJOB NOHANG FROM q\r\n", 1); got[0] != "*1" {
		t.Fatalf("GETJOB while refusing new jobs: %q", got)
	}
	if got := roundTrip(t, addr, "ADDJOB q refused 0\r\nQLEN q\r\n", 2); !strings.HasPrefix(got[0], "-NOSPACE ") || got[1] != ":0" {
		t.Fatalf("a refused ADDJOB added a job: %q", got)
	}
	fs.TestingSetDiskUsage(vfs.DiskUsage{AvailBytes: 1 << 30, TotalBytes: 2 << 30})
	waitFor("space back", "ADDJOB q after 0\r\n", "+D-")

	s.SetMaxMemory(1) // anything is over one byte
	waitFor("over maxmemory", "ADDJOB q x 0\r\n", "-OOM ")
	s.SetMaxMemory(0)
	waitFor("maxmemory off", "ADDJOB q x 0\r\n", "+D-")
}
