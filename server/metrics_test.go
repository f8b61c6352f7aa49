package server

import (
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
		`diskque_commands_processed_total{command="addjob"} 2`,
		`diskque_commands_processed_total{command="qlen"} 1`,
		`diskque_commands_processed_total{command="unknown"} 2`,
		`diskque_command_duration_seconds_count{command="addjob"} 2`,
		`diskque_registered_jobs 2`,
		`diskque_queued_jobs 2`,
		`diskque_blocked_clients 0`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, re := range []string{`(?m)^diskque_aof_segments [1-9]`, `(?m)^diskque_aof_bytes [1-9]`} {
		if !regexp.MustCompile(re).MatchString(body) {
			t.Errorf("metrics lack %s", re)
		}
	}
	if strings.Contains(body, `command="nosuch"`) || strings.Contains(body, `command="another"`) {
		t.Error("unknown command names became labels")
	}
}
