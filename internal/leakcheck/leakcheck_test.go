package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func TestLeakedFindsARunningGoroutineAndForgetsAnEndedOne(t *testing.T) {
	defer func(d time.Duration) { Timeout = d }(Timeout)
	Timeout = 50 * time.Millisecond
	b := Take()
	stop := make(chan struct{})
	go parkedForTest(stop)
	leaked := b.Leaked()
	if len(leaked) != 1 || !strings.Contains(leaked[0], "parkedForTest") {
		t.Fatalf("leaked = %q, want the one parked goroutine", leaked)
	}
	close(stop)
	if leaked := b.Leaked(); len(leaked) != 0 {
		t.Fatalf("after it ended: leaked = %q", leaked)
	}
}

func TestBaselineIgnoresGoroutinesThatWereAlreadyRunning(t *testing.T) {
	defer func(d time.Duration) { Timeout = d }(Timeout)
	Timeout = 50 * time.Millisecond
	stop := make(chan struct{})
	defer close(stop)
	go parkedForTest(stop)
	if leaked := Take().Leaked(); len(leaked) != 0 {
		t.Fatalf("leaked = %q", leaked)
	}
}

func TestParse(t *testing.T) {
	g, ok := parse("goroutine 17 [chan receive]:\nmain.f()\n\t/x.go:3 +0x1")
	if !ok || g.id != 17 {
		t.Fatalf("parse = %+v, %v", g, ok)
	}
	if _, ok := parse("not a goroutine"); ok {
		t.Fatal("parsed garbage")
	}
}

func parkedForTest(stop chan struct{}) { <-stop }
