package bench

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFmtMs(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0.000"},
		{412 * time.Microsecond, "0.412"},
		{9999 * time.Microsecond, "9.999"},
		{12345 * time.Microsecond, "12.35"},
		{123456 * time.Microsecond, "123.5"},
		{1520 * time.Millisecond, "1520"},
	} {
		if got := fmtMs(tc.d); got != tc.want {
			t.Errorf("fmtMs(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestRunTableRow(t *testing.T) {
	r := newResult(Options{Label: "diskque fsync=always", Target: TargetDiskque, Workload: WorkloadProduce, Clients: 50, Pipeline: 16, Body: 100})
	r.Ops, r.Elapsed = 1000, 2*time.Second
	r.Latency.RecordN(time.Millisecond, 990)
	r.Latency.RecordN(100*time.Millisecond, 10)
	r.PerSecond = []int64{600, 400}
	got := RunTableRow(r)
	// Percentiles are bucket midpoints (1 ms reads 1.001, 100 ms 99.88);
	// max is exact.
	want := "| diskque fsync=always | produce | 50 | 16 | 100 | 1000 | 0 | 2.00 | 500 | 400 | 1.001 | 1.001 | 99.88 | 100.0 |\n"
	if got != want {
		t.Fatalf("row\n%q\nwant\n%q", got, want)
	}
	if cols := strings.Count(strings.SplitN(RunTableHeader, "\n", 2)[0], "|"); cols != strings.Count(got, "|") {
		t.Fatalf("header has %d bars, row %d", cols, strings.Count(got, "|"))
	}
}

// TestBudget: concurrent takers never get more than the budget in all,
// and what is given back is handed out again.
func TestBudget(t *testing.T) {
	b := newBudget(10_000)
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				k := b.take(7)
				if k == 0 {
					return
				}
				if k > 1 {
					b.giveBack(1) // did one less
					k--
				}
				mu.Lock()
				total += k
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if total != 10_000 {
		t.Fatalf("handed out %d, want 10000", total)
	}
	if u := newBudget(0); u.take(16) != 16 {
		t.Fatal("unlimited budget refused")
	}
}
