package bench

import (
	"strings"
	"testing"
	"time"
)

// TestChurn runs the collector's proof benchmark end to end at a tiny
// scale against a real diskque-server: every job churned is acked, and
// the backlog is found whole before and after a SIGKILL. The disk bound
// is reported, not asserted: dead segments go at a checkpoint, and the
// server checkpoints once a minute (no directive shortens that), so a test
// of a few seconds cannot wait for the collector. The body is 1000 bytes,
// under the server's compression threshold (1 KiB), so the AOF holds the
// bodies as sent rather than s2's few dozen bytes of the bench's repeated
// alphabet.
func TestChurn(t *testing.T) {
	bin := buildServer(t)
	const backlog, count, body = 200, 2000, 1000
	o := ChurnOptions{
		ServerBin: bin,
		Args:      []string{"--appendfsync", "everysec", "--aof-segment-size", "64kb", "--gc-interval", "1"},
		Backlog:   backlog, Count: count, BodySize: body,
		Clients: 4, Pipeline: 8, Timeout: 30 * time.Second, ReadyTimeout: time.Minute,
		CatchUp: 300 * time.Millisecond, Poll: 100 * time.Millisecond, ScanCount: 64,
	}
	var progress strings.Builder
	o.Progress = &progress
	res, err := RunChurn(t.Context(), o)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", ChurnTable(o, res))

	if res.Fill == nil || res.Fill.Produced != backlog {
		t.Errorf("backlog fill: %+v, want %d jobs", res.Fill, backlog)
	}
	if res.Churn == nil || res.Produced != count || res.Consumed != count || res.ChurnLeft != 0 {
		t.Errorf("churn: added %d, acked %d, left %d; want %d, %d, 0", res.Produced, res.Consumed, res.ChurnLeft, count, count)
	}
	for name, c := range map[string]BacklogCheck{"before the kill": res.Verify, "after the restart": res.Restarted} {
		if c.Jobs != backlog || c.Intact != backlog || c.Elapsed <= 0 {
			t.Errorf("backlog %s: %+v, want %d jobs, all intact", name, c, backlog)
		}
		// A 30-day horizon: a job due already has a delay of 0 (1 in 2.6M).
		if c.Delayed < backlog-2 {
			t.Errorf("backlog %s: %d still delayed, want about %d", name, c.Delayed, backlog)
		}
	}
	if res.SegmentSize != 64<<10 || res.LiveBytes != backlog*body || res.Bound != 3*backlog*body+2*64<<10 {
		t.Errorf("segment %d, live %d, bound %d", res.SegmentSize, res.LiveBytes, res.Bound)
	}
	if res.FilledBytes <= 0 || res.PeakBytes < res.FilledBytes || res.AfterChurn <= 0 || res.FinalBytes <= 0 || res.KilledBytes <= 0 {
		t.Errorf("data dir: filled %d, peak %d, after churn %d, final %d, killed %d",
			res.FilledBytes, res.PeakBytes, res.AfterChurn, res.FinalBytes, res.KilledBytes)
	}
	if res.CatchUpTime <= 0 || res.CatchUpPeak < res.FinalBytes || res.Pass != (res.FinalBytes <= res.Bound) {
		t.Errorf("catch-up %v, pass %v with %d bytes for a bound of %d", res.CatchUpTime, res.Pass, res.FinalBytes, res.Bound)
	}
	// The server compresses nothing under 1 KiB: the live bodies it holds
	// are the backlog's, byte for byte.
	if res.StoredLive != backlog*body {
		t.Errorf("INFO live_bytes %d, want %d", res.StoredLive, backlog*body)
	}
	if len(res.Storage) == 0 {
		t.Error("no INFO Storage lines")
	}
	if res.RSSBytes <= 0 || res.RestartRSS <= 0 || res.Ready <= 0 {
		t.Errorf("RSS %d, restart RSS %d, ready %v: want all positive", res.RSSBytes, res.RestartRSS, res.Ready)
	}
}

func TestChurnOptions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int64
	}{
		{nil, 64 << 20},
		{[]string{"--appendfsync", "always"}, 64 << 20},
		{[]string{"--aof-segment-size", "64kb"}, 64 << 10},
		{[]string{"--aof-segment-size=1mb", "--gc-interval", "1"}, 1 << 20},
		{[]string{"--aof-segment-size", "4096", "--aof-segment-size", "8k"}, 8000},
		{[]string{"--aof-segment-size"}, 64 << 20},
	} {
		if got := segmentSizeFromArgs(c.args); got != c.want {
			t.Errorf("segmentSizeFromArgs(%q) = %d, want %d", c.args, got, c.want)
		}
	}
	if _, err := RunChurn(t.Context(), ChurnOptions{ServerBin: "/nonexistent"}); err == nil {
		t.Error("missing binary: no error")
	}
	if _, err := RunChurn(t.Context(), ChurnOptions{Clients: 1}); err == nil {
		t.Error("one client: no error")
	}
	if _, err := RunChurn(t.Context(), ChurnOptions{Queue: "q", BacklogQueue: "q"}); err == nil {
		t.Error("one queue for both: no error")
	}
}
