package bench

import (
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/testtool"
)

// goTool finds the go command: on PATH, else in the toolchain that built
// this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// buildServer builds cmd/diskque-server into a temporary directory (not
// with -race: the test measures nothing, but a race-built server would
// only be slower).
func buildServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "diskque-server")
	out, err := exec.Command(goTool(), "build", "-o", bin, "github.com/diskque/diskque/cmd/diskque-server").CombinedOutput()
	if err != nil {
		t.Fatalf("go build diskque-server: %v\n%s", err, out)
	}
	return bin
}

// startServer starts bin and stops it at cleanup, failing the test if the
// stop is not clean.
func startServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	cfg.Dir = t.TempDir()
	srv, err := StartServer(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if lines, n := srv.Notable(); n > 0 {
			t.Logf("server logged %d warnings: %q", n, lines)
		}
	})
	return srv
}

func qlen(t *testing.T, srv *Server, target Target, queue string) int64 {
	t.Helper()
	n, err := QueueLen(srv.Addr, target, queue)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func run(t *testing.T, opts Options) *Result {
	t.Helper()
	res, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatalf("%s %s: %v", opts.Target, opts.Workload, err)
	}
	if res.Errors != 0 {
		t.Fatalf("%s %s: %d error replies: %v", opts.Target, opts.Workload, res.Errors, res.ErrorSamples)
	}
	t.Logf("%s", strings.TrimSpace(RunTableRow(res)))
	return res
}

// TestEndToEnd builds diskque-server once for its subtests.
func TestEndToEnd(t *testing.T) {
	bin := buildServer(t)
	t.Run("diskque", func(t *testing.T) { testDiskque(t, bin) })
	t.Run("matrix", func(t *testing.T) { testMatrix(t, bin) })
	t.Run("delayed", func(t *testing.T) { testDelayed(t, bin) })
	t.Run("restart", func(t *testing.T) { testRestart(t, bin, WorkloadProduce) })
	t.Run("restart-delayed", func(t *testing.T) { testRestart(t, bin, WorkloadDelayed) })
	t.Run("bus-port-taken", func(t *testing.T) { testBusPortTaken(t, bin) })
}

// testBusPortTaken: a server spawned on a port whose port + 10000 (a lone
// node's default bus port) another process holds still starts: the bench
// gives it a free bus port. Before, the restart workload's second exec on
// the same port failed when that port had been taken meanwhile.
func testBusPortTaken(t *testing.T, bin string) {
	var port int
	var held net.Listener
	for range 20 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000))); err == nil {
			port, held = p, l
			break
		}
	}
	if held == nil {
		t.Fatal("no port whose port + 10000 could be held")
	}
	defer held.Close()
	srv, err := spawn(ServerConfig{Target: TargetDiskque, Bin: bin, Dir: t.TempDir(), ReadyTimeout: 30 * time.Second}, port)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	if err := srv.waitReady(t.Context()); err != nil {
		t.Fatalf("with its default bus port taken: %v", err)
	}
}

func testDiskque(t *testing.T, bin string) {
	srv := startServer(t, ServerConfig{Target: TargetDiskque, Bin: bin, Args: []string{"--appendfsync", "everysec"}})
	const jobs = 2000
	base := Options{Addr: srv.Addr, Target: TargetDiskque, Clients: 4, Pipeline: 4, Body: 100, Queue: "e2e", Timeout: 30 * time.Second}

	p := base
	p.Workload, p.Count = WorkloadProduce, jobs
	res := run(t, p)
	if res.Produced != jobs || res.Ops != jobs || res.Latency.Count() != jobs || res.Commands[cmdAddJob].Count() != jobs {
		t.Fatalf("produce: produced %d, ops %d, latencies %d, ADDJOB latencies %d; want %d each",
			res.Produced, res.Ops, res.Latency.Count(), res.Commands[cmdAddJob].Count(), jobs)
	}
	if n := qlen(t, srv, TargetDiskque, "e2e"); n != jobs {
		t.Fatalf("QLEN after produce = %d, want %d", n, jobs)
	}

	c := base
	c.Workload, c.Count = WorkloadConsume, jobs
	res = run(t, c)
	if res.Consumed != jobs || res.Latency.Count() != jobs {
		t.Fatalf("consume: consumed %d, latencies %d; want %d", res.Consumed, res.Latency.Count(), jobs)
	}
	// COUNT 4 per GETJOB: at least jobs/4 GETJOBs, one ACKJOB per GETJOB
	// that returned jobs.
	if g, a := res.Commands[cmdGetJob].Count(), res.Commands[cmdAckJob].Count(); a < jobs/4 || g < a {
		t.Fatalf("consume: %d GETJOBs and %d ACKJOBs for %d jobs", g, a, jobs)
	}
	if n := qlen(t, srv, TargetDiskque, "e2e"); n != 0 {
		t.Fatalf("QLEN after consume = %d, want 0", n)
	}

	// On an empty queue a consume run ends at once, whatever its duration.
	c.Count, c.Duration = 0, time.Minute
	start := time.Now()
	res = run(t, c)
	if res.Consumed != 0 || res.EmptyPolls != int64(c.Clients) || time.Since(start) > 30*time.Second {
		t.Fatalf("consume on empty queue: consumed %d, empty polls %d, took %v", res.Consumed, res.EmptyPolls, time.Since(start))
	}

	// Mixed: half produce, half consume; everything produced is consumed.
	m := base
	m.Workload, m.Count = WorkloadMixed, jobs
	res = run(t, m)
	if res.Produced != jobs/2 || res.Consumed != jobs/2 {
		t.Fatalf("mixed: produced %d, consumed %d; want %d each", res.Produced, res.Consumed, jobs/2)
	}
	if n := qlen(t, srv, TargetDiskque, "e2e"); n != 0 {
		t.Fatalf("QLEN after mixed = %d, want 0", n)
	}

	// The JSON line carries the figures.
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	lat, _ := j["latency"].(map[string]any)
	if j["workload"] != "mixed" || j["ops"] != float64(jobs) || lat == nil || lat["count"] != float64(jobs) || lat["p99_us"].(float64) <= 0 {
		t.Fatalf("JSON: %s", b)
	}
}

// TestEndToEndRedis runs the redis variants (LPUSH, RPOP) against
// redis-server: skipped when it is not installed, failed so under CI
// (internal/testtool).
func TestEndToEndRedis(t *testing.T) {
	bin := testtool.Require(t, "redis-server")
	srv := startServer(t, ServerConfig{Target: TargetRedis, Bin: bin, Args: []string{"--save", "", "--appendonly", "no"}})
	const jobs = 2000
	base := Options{Addr: srv.Addr, Target: TargetRedis, Clients: 4, Pipeline: 4, Queue: "e2e", Timeout: 30 * time.Second}

	p := base
	p.Workload, p.Count = WorkloadProduce, jobs
	if res := run(t, p); res.Produced != jobs {
		t.Fatalf("produce: %d, want %d", res.Produced, jobs)
	}
	if n := qlen(t, srv, TargetRedis, "e2e"); n != jobs {
		t.Fatalf("LLEN = %d, want %d", n, jobs)
	}
	// No count: consume until the list is empty.
	c := base
	c.Workload, c.Duration = WorkloadConsume, time.Minute
	if res := run(t, c); res.Consumed != jobs {
		t.Fatalf("consume: %d, want %d", res.Consumed, jobs)
	}
	m := base
	m.Workload, m.Count = WorkloadMixed, jobs
	if res := run(t, m); res.Produced != jobs/2 || res.Consumed != jobs/2 {
		t.Fatalf("mixed: produced %d, consumed %d", res.Produced, res.Consumed)
	}
	if n := qlen(t, srv, TargetRedis, "e2e"); n != 0 {
		t.Fatalf("LLEN = %d, want 0", n)
	}
}

// testMatrix runs a small matrix: servers start and stop, produce fills
// what consume drains, and the table has a row per run.
func testMatrix(t *testing.T, bin string) {
	modes := []Mode{DefaultModes()[0], DefaultModes()[3]} // appendonly=no, fsync=always
	redis := testtool.Optional(t, "redis-server")
	if redis != "" {
		modes = append(modes, DefaultModes()[4])
	}
	var progress strings.Builder
	var jsonLines strings.Builder
	results, err := RunMatrix(t.Context(), MatrixOptions{
		ServerBin: bin, RedisBin: redis, Modes: modes, Pipelines: []int{1, 4},
		Clients: 4, Count: 400, Timeout: 30 * time.Second, Progress: &progress, JSON: &jsonLines,
	})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := len(modes) * 2 * 2; len(results) != want {
		t.Fatalf("%d results, want %d", len(results), want)
	}
	for _, r := range results {
		if r.Ops != 400 || r.Errors != 0 || r.Err != "" {
			t.Errorf("%s %s p%d: ops %d, errors %d, err %q", r.Label, r.Workload, r.Pipeline, r.Ops, r.Errors, r.Err)
		}
		want := int64(0)
		if r.Workload == WorkloadProduce {
			want = 400
		}
		if r.QueueLeft != want {
			t.Errorf("%s %s p%d: queue left %d, want %d", r.Label, r.Workload, r.Pipeline, r.QueueLeft, want)
		}
	}
	table := MatrixTable(results)
	if n := strings.Count(table, "\n"); n != 2+len(results) {
		t.Errorf("table has %d lines, want %d:\n%s", n, 2+len(results), table)
	}
	if n := strings.Count(jsonLines.String(), "\n"); n != len(results) {
		t.Errorf("%d JSON lines, want %d", n, len(results))
	}
	t.Logf("\n%s", table)
}
