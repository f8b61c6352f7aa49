package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func fakeResults() []*Result {
	var out []*Result
	for i, mode := range []string{"diskque appendonly=no", "diskque fsync=always"} {
		for _, p := range []int{1, 16} {
			for _, w := range []Workload{WorkloadProduce, WorkloadConsume} {
				r := newResult(Options{Label: mode, Target: TargetDiskque, Workload: w, Pipeline: p, Clients: 20, Body: 100})
				r.Start = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
				r.Ops = int64(1000 * p * (i + 1))
				r.Elapsed = time.Second
				r.Latency.Record(time.Duration(p*(i+1)) * time.Millisecond)
				out = append(out, r)
			}
		}
	}
	return out
}

func TestWriteChart(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file   string
		metric ChartMetric
		magic  []byte
	}{
		{"ops.svg", ChartOpsPerSec, []byte("<svg")},
		{"p99.svg", ChartP99, []byte("<svg")},
		{"ops.png", ChartOpsPerSec, []byte("\x89PNG\r\n\x1a\n")},
	} {
		path := filepath.Join(dir, tc.file)
		if err := WriteChart(path, fakeResults(), tc.metric); err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		head := b[:min(len(b), 512)]
		if !bytes.Contains(head, tc.magic) {
			t.Errorf("%s: %d bytes, header %q, want %q", tc.file, len(b), head[:min(len(head), 64)], tc.magic)
		}
	}
	if err := WriteChart(filepath.Join(dir, "x.txt"), fakeResults(), ChartOpsPerSec); err == nil {
		t.Error(".txt: no error")
	}
	if err := WriteChart(filepath.Join(dir, "x.svg"), nil, ChartOpsPerSec); err == nil {
		t.Error("no results: no error")
	}
}
