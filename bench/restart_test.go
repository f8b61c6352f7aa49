package bench

import (
	"strings"
	"testing"
	"time"
)

// testDelayed fills a delayed backlog: every ADDJOB DELAY succeeds and no
// job is ready (QLEN 0), since every delay lies in the future.
func testDelayed(t *testing.T, bin string) {
	srv := startServer(t, ServerConfig{Target: TargetDiskque, Bin: bin})
	const jobs = 1000
	res := run(t, Options{
		Addr: srv.Addr, Target: TargetDiskque, Workload: WorkloadDelayed, Clients: 4, Pipeline: 8,
		Count: jobs, Queue: "delayed", Horizon: 30 * 24 * time.Hour, Timeout: 30 * time.Second,
	})
	if res.Produced != jobs || res.Latency.Count() != jobs || res.Commands[cmdAddJobDelay].Count() != jobs {
		t.Fatalf("delayed: produced %d, latencies %d, commands %v; want %d", res.Produced, res.Latency.Count(), res.Commands, jobs)
	}
	// A delay of 0 is possible (1 in 2.6M per job): allow a few ready jobs.
	if n := qlen(t, srv, TargetDiskque, "delayed"); n > 2 {
		t.Fatalf("QLEN after a delayed fill = %d, want about 0", n)
	}
	// The jobs exist: the server's INFO counts them.
	replies, err := Do(srv.Addr, 5*time.Second, []string{"INFO"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("INFO jobs lines: %q", grepLines(replies[0].Str, "job"))
}

func grepLines(s, sub string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// testRestart fills a server with a few jobs, SIGKILLs it and measures the
// restart.
func testRestart(t *testing.T, bin string, fill Workload) {
	const jobs = 500
	o := RestartOptions{
		ServerBin: bin, Args: []string{"--appendfsync", "always"}, Fill: fill, Count: jobs,
		Clients: 4, Pipeline: 8, Timeout: 30 * time.Second, ReadyTimeout: time.Minute,
	}
	var progress strings.Builder
	o.Progress = &progress
	res, err := RunRestart(t.Context(), o)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", RestartTable(o, res))
	if res.Fill.Produced != jobs {
		t.Fatalf("filled %d, want %d", res.Fill.Produced, jobs)
	}
	if res.RSSBytes <= 0 || res.DataBytes <= 0 {
		t.Errorf("RSS %d, data %d: want both positive", res.RSSBytes, res.DataBytes)
	}
	if res.Ready <= 0 || res.FirstJob < res.Ready && fill == WorkloadDelayed || res.FirstJob <= 0 {
		t.Errorf("ready %v, first job %v", res.Ready, res.FirstJob)
	}
	switch fill {
	case WorkloadProduce:
		// appendfsync always: every acknowledged ADDJOB survives SIGKILL.
		if res.Jobs != jobs || res.After != jobs {
			t.Errorf("QLEN before the kill %d, after the restart %d; want %d", res.Jobs, res.After, jobs)
		}
	case WorkloadDelayed:
		if res.Jobs > 2 || res.After > 2 {
			t.Errorf("QLEN before %d, after %d; want about 0 (all delayed)", res.Jobs, res.After)
		}
	}
}

func TestRestartOptions(t *testing.T) {
	if _, err := RunRestart(t.Context(), RestartOptions{ServerBin: "/nonexistent", Count: 1}); err == nil {
		t.Error("missing binary: no error")
	}
	if _, err := RunRestart(t.Context(), RestartOptions{Fill: WorkloadConsume, Count: 1}); err == nil {
		t.Error("consume fill: no error")
	}
	if _, err := RunRestart(t.Context(), RestartOptions{}); err == nil {
		t.Error("no count: no error")
	}
	o := Options{Target: TargetRedis, Workload: WorkloadDelayed, Count: 1}
	o.ensureDefaults()
	if err := o.Validate(); err == nil {
		t.Error("delayed on redis: no error")
	}
	o = Options{Workload: WorkloadDelayed, Count: 1}
	o.ensureDefaults()
	if err := o.Validate(); err != nil || o.Horizon != DefaultHorizon {
		t.Errorf("delayed defaults: %v, horizon %v", err, o.Horizon)
	}
	o = Options{Workload: WorkloadRestart, Count: 1}
	o.ensureDefaults()
	if err := o.Validate(); err == nil {
		t.Error("Run with restart: no error")
	}
}

func TestProgressLine(t *testing.T) {
	l := progressLine(Options{Label: "x", Workload: WorkloadProduce, Pipeline: 16, Count: 1000}, 500, 2*time.Second)
	if !strings.Contains(l, "500/1000 (50%)") || !strings.Contains(l, "250 ops/s") {
		t.Errorf("progress line %q", l)
	}
	l = progressLine(Options{Label: "x", Workload: WorkloadProduce, Pipeline: 1, Duration: 10 * time.Second}, 30, 3*time.Second)
	if !strings.Contains(l, "(3s/10s)") || !strings.Contains(l, "10 ops/s") {
		t.Errorf("progress line %q", l)
	}
}
