package main

// metrics-addr's HTTP server: Go's profiler only with pprof yes, and the
// warning a non-loopback metrics address logs at start.

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// httpGet fetches url and returns its status and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// waitLog waits until the running process of s has logged want.
func waitLog(t *testing.T, s *daemon, want string) string {
	t.Helper()
	var out string
	waitUntil(t, readyTimeout, "the log line "+strconv.Quote(want), func() bool {
		out = s.proc.out.String()
		return strings.Contains(out, want)
	})
	return out
}

// TestPprofOptIn: by default metrics-addr serves /metrics and no profiler;
// with pprof yes it serves the profiler too, except the command line (it
// may hold --requirepass).
func TestPprofOptIn(t *testing.T) {
	t.Parallel()
	for _, pprofOn := range []bool{false, true} {
		t.Run("pprof="+strconv.FormatBool(pprofOn), func(t *testing.T) {
			t.Parallel()
			maddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
			flags := []string{"--metrics-addr", maddr}
			if pprofOn {
				flags = append(flags, "--pprof", "yes")
			}
			s := startServer(t, flags...)
			c := s.client(t)
			want := "no"
			if pprofOn {
				want = "yes"
			}
			if got := doArr(t, c, "CONFIG", "GET", "pprof"); len(got) != 2 || got[1] != want {
				t.Errorf("CONFIG GET pprof = %v, want [pprof %s]", got, want)
			}
			wantErr(t, c, "ERR CONFIG SET of 'pprof' needs a restart", "CONFIG", "SET", "pprof", "yes")
			base := "http://" + maddr
			if code, body := httpGet(t, base+"/metrics"); code != 200 || !strings.Contains(body, "diskque_registered_jobs") {
				t.Errorf("/metrics: %d %.200q", code, body)
			}
			for path, profile := range map[string]string{
				"/debug/pprof/": "goroutine", "/debug/pprof/goroutine?debug=1": "goroutine profile:",
				"/debug/pprof/heap?debug=1": "heap profile:",
			} {
				code, body := httpGet(t, base+path)
				switch {
				case pprofOn && (code != 200 || !strings.Contains(body, profile)):
					t.Errorf("pprof yes: %s: %d %.200q, want 200 and a profile", path, code, body)
				case !pprofOn && code != 404:
					t.Errorf("pprof no: %s: %d %.200q, want 404", path, code, body)
				}
			}
			if code, body := httpGet(t, base+"/debug/pprof/cmdline"); code != 404 {
				t.Errorf("/debug/pprof/cmdline: %d %.200q, want 404 (it may show --requirepass)", code, body)
			}
			// On loopback: no warning (it would come before the store opens).
			out := waitLog(t, s, "ready to accept commands")
			if strings.Contains(out, metricsExposedWarning) {
				t.Errorf("metrics on loopback logged the warning:\n%s", out)
			}
		})
	}
}

// TestMetricsAddrNotLoopbackWarns: a metrics address anyone on the network
// can reach logs a warning at start, naming the address.
func TestMetricsAddrNotLoopbackWarns(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(freePort(t))
	s := startServer(t, "--metrics-addr", net.JoinHostPort("0.0.0.0", port))
	// The warning comes before the store opens.
	out := waitLog(t, s, "ready to accept commands")
	if !strings.Contains(out, "level=WARN msg=\""+metricsExposedWarning) {
		t.Fatalf("no warning for metrics on %s:\n%s", net.JoinHostPort("0.0.0.0", port), out)
	}
	if !strings.Contains(out, ":"+port+" pprof=false") {
		t.Errorf("the warning does not name the address:\n%s", out)
	}
}

// TestPprofDirective: pprof takes yes or no and needs metrics-addr; the
// usage text documents it.
func TestPprofDirective(t *testing.T) {
	if cfg, err := parseArgs(nil); err != nil || cfg.Pprof {
		t.Fatalf("default pprof = %v, %v; want off", cfg.Pprof, err)
	}
	if cfg, err := parseArgs([]string{"--metrics-addr", "127.0.0.1:9", "--pprof", "YES"}); err != nil || !cfg.Pprof || cfg.value("pprof") != "yes" {
		t.Errorf("--pprof YES = %v, %v", cfg.Pprof, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pprof", "yes"}, "pprof yes needs metrics-addr"},
		{[]string{"--metrics-addr", "127.0.0.1:9", "--pprof", "on"}, `pprof: want yes or no, got "on"`},
	} {
		if _, err := parseArgs(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseArgs(%q) = %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	if !strings.Contains(usage, "  pprof yes|no ") {
		t.Error("usage does not document pprof")
	}
}
