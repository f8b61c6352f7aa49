package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Result is what one run measured.
type Result struct {
	Label    string
	Target   Target
	Addr     string
	Workload Workload
	Clients  int
	Pipeline int
	Body     int

	Start   time.Time
	Elapsed time.Duration // first batch written to last reply read
	LoadAvg string        // /proc/loadavg's three averages at the start

	Ops       int64 // Produced + Consumed
	Produced  int64 // jobs added (replies that were not errors)
	Consumed  int64 // jobs taken (and, for diskque, acknowledged)
	Prefilled int64 // jobs added by Options.Prefill before the run

	// Errors counts error replies; ErrorSamples maps "COMMAND: -message"
	// to its count (at most 16 kinds per client, the rest "other errors").
	Errors       int64
	ErrorSamples map[string]int64
	// EmptyPolls counts GETJOB / RPOP batches that found the queue empty.
	EmptyPolls int64

	// Latency holds one observation per operation: for a produced job,
	// from the write of its pipeline batch to the read of its reply; for a
	// job consumed from diskque, from the write of the GETJOB to the read
	// of the ACKJOB reply; for a job consumed from redis, from the write
	// of its RPOP batch to the read of its reply.
	Latency *Histogram
	// Commands holds one observation per command, from the write of its
	// batch to the read of its reply, by command name.
	Commands map[string]*Histogram
	// PerSecond is the number of operations completed in each whole second
	// of the run (the last partial second is not included).
	PerSecond []int64

	// QueueLeft is the queue length after the run, -1 if not checked.
	QueueLeft int64
	// Err is the run's error, if it failed (set by RunMatrix).
	Err string
}

func newResult(o Options) *Result {
	return &Result{
		Label: o.Label, Target: o.Target, Addr: o.Addr, Workload: o.Workload,
		Clients: o.Clients, Pipeline: o.Pipeline, Body: o.Body,
		LoadAvg:      loadAvg(),
		ErrorSamples: make(map[string]int64),
		Latency:      NewHistogram(),
		Commands:     make(map[string]*Histogram),
		QueueLeft:    -1,
	}
}

// add merges one client's statistics.
func (r *Result) add(c *client) {
	r.Produced += c.produced
	r.Consumed += c.consumed
	r.Ops += c.produced + c.consumed
	r.Errors += c.errors
	r.EmptyPolls += c.emptyPolls
	for k, n := range c.errSamples {
		r.ErrorSamples[k] += n
	}
	r.Latency.Merge(c.lat)
	for name, h := range c.cmds {
		if h.Count() == 0 {
			continue
		}
		if r.Commands[name] == nil {
			r.Commands[name] = NewHistogram()
		}
		r.Commands[name].Merge(h)
	}
}

// OpsPerSec is Ops over Elapsed.
func (r *Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// WorstSecond is the fewest operations completed in one whole second, -1
// when the run lasted less than a second.
func (r *Result) WorstSecond() int64 {
	if len(r.PerSecond) == 0 {
		return -1
	}
	return slices.Min(r.PerSecond)
}

// firstError returns one error sample (the most frequent).
func (r *Result) firstError() string {
	best, n := "", int64(-1)
	for _, k := range slices.Sorted(maps.Keys(r.ErrorSamples)) {
		if r.ErrorSamples[k] > n {
			best, n = k, r.ErrorSamples[k]
		}
	}
	return best
}

// fmtMs formats d in milliseconds with three significant digits or so.
func fmtMs(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return fmt.Sprintf("%.3f", ms)
	case ms < 100:
		return fmt.Sprintf("%.2f", ms)
	case ms < 1000:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

// RunTableHeader is the header of the per-run markdown table; RunTableRow
// formats one row of it.
const RunTableHeader = "| run | workload | clients | pipeline | body | ops | errors | seconds | ops/s | worst 1s | p50 ms | p99 ms | p99.9 ms | max ms |\n" +
	"|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"

// RunTableRow formats r as one row under RunTableHeader.
func RunTableRow(r *Result) string {
	worst := "-"
	if w := r.WorstSecond(); w >= 0 {
		worst = fmt.Sprint(w)
	}
	return fmt.Sprintf("| %s | %s | %d | %d | %d | %d | %d | %.2f | %.0f | %s | %s | %s | %s | %s |\n",
		r.Label, r.Workload, r.Clients, r.Pipeline, r.Body, r.Ops, r.Errors, r.Elapsed.Seconds(),
		r.OpsPerSec(), worst, fmtMs(r.Latency.Quantile(0.50)), fmtMs(r.Latency.Quantile(0.99)),
		fmtMs(r.Latency.Quantile(0.999)), fmtMs(r.Latency.Max()))
}

// MatrixTable formats results as the comparison table: one row per mode ×
// workload × pipeline, in the order given.
func MatrixTable(results []*Result) string {
	var b strings.Builder
	b.WriteString("| mode | workload | pipeline | ops | ops/s | worst 1s | p50 ms | p99 ms | p99.9 ms | max ms | errors |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		worst := "-"
		if w := r.WorstSecond(); w >= 0 {
			worst = fmt.Sprint(w)
		}
		errs := fmt.Sprint(r.Errors)
		if r.Err != "" {
			errs += " (failed: " + strings.ReplaceAll(r.Err, "|", "/") + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.0f | %s | %s | %s | %s | %s | %s |\n",
			r.Label, r.Workload, r.Pipeline, r.Ops, r.OpsPerSec(), worst,
			fmtMs(r.Latency.Quantile(0.50)), fmtMs(r.Latency.Quantile(0.99)),
			fmtMs(r.Latency.Quantile(0.999)), fmtMs(r.Latency.Max()), errs)
	}
	return b.String()
}

// latencyJSON is a histogram's summary in microseconds.
type latencyJSON struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
}

func summarize(h *Histogram) latencyJSON {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return latencyJSON{
		Count: h.Count(), P50: us(h.Quantile(0.50)), P99: us(h.Quantile(0.99)),
		P999: us(h.Quantile(0.999)), Max: us(h.Max()),
	}
}

type resultJSON struct {
	Time         string                 `json:"time"`
	Label        string                 `json:"label"`
	Target       Target                 `json:"target"`
	Addr         string                 `json:"addr"`
	Workload     Workload               `json:"workload"`
	Clients      int                    `json:"clients"`
	Pipeline     int                    `json:"pipeline"`
	Body         int                    `json:"body"`
	Ops          int64                  `json:"ops"`
	Produced     int64                  `json:"produced"`
	Consumed     int64                  `json:"consumed"`
	Prefilled    int64                  `json:"prefilled,omitempty"`
	Errors       int64                  `json:"errors"`
	ErrorSamples map[string]int64       `json:"error_samples,omitempty"`
	EmptyPolls   int64                  `json:"empty_polls"`
	ElapsedSec   float64                `json:"elapsed_s"`
	OpsPerSec    float64                `json:"ops_per_s"`
	Latency      latencyJSON            `json:"latency"`
	Commands     map[string]latencyJSON `json:"commands"`
	PerSecond    []int64                `json:"per_second"`
	QueueLeft    *int64                 `json:"queue_left,omitempty"`
	Err          string                 `json:"error,omitempty"`
	LoadAvg      string                 `json:"loadavg,omitempty"`
	NumCPU       int                    `json:"num_cpu"`
	GoVersion    string                 `json:"go"`
}

// MarshalJSON renders r as one flat JSON object, latencies in µs.
func (r *Result) MarshalJSON() ([]byte, error) {
	j := resultJSON{
		Time: r.Start.UTC().Format(time.RFC3339), Label: r.Label, Target: r.Target, Addr: r.Addr,
		Workload: r.Workload, Clients: r.Clients, Pipeline: r.Pipeline, Body: r.Body,
		Ops: r.Ops, Produced: r.Produced, Consumed: r.Consumed, Prefilled: r.Prefilled,
		Errors: r.Errors, ErrorSamples: r.ErrorSamples, EmptyPolls: r.EmptyPolls,
		ElapsedSec: r.Elapsed.Seconds(), OpsPerSec: r.OpsPerSec(),
		Latency: summarize(r.Latency), Commands: make(map[string]latencyJSON),
		PerSecond: r.PerSecond, Err: r.Err, LoadAvg: r.LoadAvg,
		NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(),
	}
	if len(j.ErrorSamples) == 0 {
		j.ErrorSamples = nil
	}
	for name, h := range r.Commands {
		j.Commands[name] = summarize(h)
	}
	if r.QueueLeft >= 0 {
		left := r.QueueLeft
		j.QueueLeft = &left
	}
	if j.PerSecond == nil {
		j.PerSecond = []int64{}
	}
	return json.Marshal(j)
}

// WriteJSONLine appends r to w as one line of JSON.
func WriteJSONLine(w io.Writer, r *Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
