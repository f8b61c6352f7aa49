package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestMetrics(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	hs := httptest.NewServer(s.MetricsHandler())
	defer hs.Close()
	rc := dialResp(t, addr)
	for _, cmd := range []string{"ADDJOB q a 0", "ADDJOB q b 0", "QLEN q", "NOSUCH x", "ANOTHER y"} {
		rc.do(cmd)
	}
	// 25 more queues of one job each: only the 20 longest queues are
	// exported, so client-chosen names cannot grow the metrics.
	for i := range 25 {
		rc.do(fmt.Sprintf("ADDJOB many%02d x 0", i))
	}
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	body := string(b)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{
		`diskque_commands_processed_total{command="addjob"} 27`,
		`diskque_commands_processed_total{command="qlen"} 1`,
		`diskque_commands_processed_total{command="unknown"} 2`,
		`diskque_command_duration_seconds_count{command="addjob"} 27`,
		`diskque_registered_jobs 27`,
		`diskque_queued_jobs 27`,
		`diskque_queue_length{queue="q"} 2`,
		`diskque_queue_length{queue="many00"} 1`,
		`diskque_gc_segments_removed_total 0`,
		`diskque_blocked_clients 0`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if n := strings.Count(body, "\ndiskque_queue_length{"); n != metricQueues {
		t.Errorf("%d queue_length series, want %d", n, metricQueues)
	}
	for _, re := range []string{`(?m)^diskque_aof_segments [1-9]`, `(?m)^diskque_aof_bytes [1-9]`,
		`(?m)^diskque_aof_written_bytes_total [1-9]`, `(?m)^diskque_aof_fsyncs_total [1-9]`,
		`(?m)^diskque_index_bytes \d`, `(?m)^diskque_gc_bytes_reclaimed_total 0$`,
		`(?m)^go_gc_gomemlimit_bytes \d`, `(?m)^go_gc_gogc_percent \d`, `(?m)^go_gc_duration_seconds_count \d`,
		`(?m)^process_resident_memory_bytes [1-9]`, `(?m)^process_cpu_seconds_total \d`} {
		if !regexp.MustCompile(re).MatchString(body) {
			t.Errorf("metrics lack %s", re)
		}
	}
	if strings.Contains(body, `command="nosuch"`) || strings.Contains(body, `command="another"`) {
		t.Error("unknown command names became labels")
	}
}

// TestPipelinedAddJobsCountOneEach: a run of pipelined ADDJOBs executes as
// one batch, but INFO and /metrics count every command of it.
func TestPipelinedAddJobsCountOneEach(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	hs := httptest.NewServer(s.MetricsHandler())
	defer hs.Close()
	rc := dialResp(t, addr)
	before := s.commands.Load()
	rc.send(strings.Repeat("ADDJOB q body 0\r\n", 5))
	for range 5 {
		if got := rc.read(); !strings.HasPrefix(got, "+D-") {
			t.Fatal(got)
		}
	}
	if got := s.commands.Load() - before; got != 5 {
		t.Errorf("total_commands_processed grew by %d for 5 pipelined ADDJOBs", got)
	}
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`diskque_commands_processed_total{command="addjob"} 5`, `diskque_command_duration_seconds_count{command="addjob"} 5`} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
