package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/gc"
)

// infoField reads one field of INFO section.
func infoField(rc *respConn, section, field string) string {
	for _, line := range strings.Split(rc.do("INFO "+section), "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// TestBgRewriteAOF: BGREWRITEAOF starts a full collection in the background;
// INFO shows it running, then done, with what it moved and reclaimed; the
// jobs that lived through it are intact.
func TestBgRewriteAOF(t *testing.T) {
	s, addr := startServer(t)
	rc := dialResp(t, addr)
	b := newBroker(t) // 64 KiB segments
	s.SetBroker(b)
	if got := rc.do("BGREWRITEAOF"); got != "-ERR no segment collector is running" {
		t.Fatalf("BGREWRITEAOF without a collector: %q", got)
	}
	col, err := gc.New(b.Store(), gc.Options{Interval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close) // before the broker's cleanup, registered earlier
	s.SetCollector(col)
	body := strings.Repeat("x", 900)
	var keep []string
	for i := range 300 {
		id := strings.TrimPrefix(rc.do("ADDJOB q "+body+string(rune('a'+i%26))+" 0"), "+")
		if i%10 == 0 {
			keep = append(keep, id)
		} else if got := rc.do("DELJOB " + id); got != ":1" {
			t.Fatalf("DELJOB %s: %q", id, got)
		}
	}
	if got := rc.do("BGREWRITEAOF"); got != "+Background append only file rewriting started" {
		t.Fatalf("BGREWRITEAOF: %q", got)
	}
	deadline := time.Now().Add(20 * time.Second)
	for infoField(rc, "storage", "gc_full_collections") != "1" || infoField(rc, "persistence", "aof_rewrite_in_progress") != "0" {
		if time.Now().After(deadline) {
			t.Fatalf("the collection did not finish: %q", rc.do("INFO storage"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := infoField(rc, "persistence", "aof_last_bgrewrite_status"); got != "ok" {
		t.Errorf("aof_last_bgrewrite_status:%s", got)
	}
	if got := infoField(rc, "storage", "gc_segments_removed"); got == "0" || got == "" {
		t.Errorf("gc_segments_removed:%s after a full collection", got)
	}
	if got := infoField(rc, "storage", "gc_bodies_moved"); got == "0" || got == "" {
		t.Errorf("gc_bodies_moved:%s after a full collection", got)
	}
	if got := infoField(rc, "storage", "live_bodies"); got != "30" {
		t.Errorf("live_bodies:%s, want 30", got)
	}
	for _, id := range keep {
		if got := rc.do("SHOW " + id); !strings.Contains(got, body) {
			t.Fatalf("SHOW %s after the rewrite: %q", id, got)
		}
	}
}
