// Command crosslat measures cross-node latency in a Disque-compatible
// cluster: producers add jobs on one node at a steady rate, consumers take
// them from another (GETJOB blocks there, and federation — NEEDJOBS /
// YOURJOBS — moves the jobs), and each job's latency is the time from its
// ADDJOB reply to the GETJOB reply that delivered it, both read by this
// process on one monotonic clock. It prints the jobs/s consumed and the
// latency's p50/p90/p99/max (bench.Histogram, about 1% precision).
//
//	crosslat -produce 127.0.0.1:7711 -consume 127.0.0.1:7712 -rate 2000 -duration 10s
//
// The producers are paced open-loop (job k is due at start + k/rate; a
// late producer catches up without waiting), so the rate does not fall
// when the cluster slows down; latency starts at the ADDJOB reply, not
// at the job's due time.
//
// The consumers' node discovers its sources by a broadcast NEEDJOBS,
// which goes at most every 2 s doubling (the cluster contract's
// "Federation"), so jobs added before that wait seconds for it, and the
// backlog they leave is drained at the federation's top speed, not at the
// rate: a start-up cost, not the steady latency. So by default (-prime)
// one job is added every 50 ms, and not measured, until the consumers got
// one; then the paced producers start, and jobs added in their first
// -warmup are consumed but not measured either. Without -prime the paced
// producers start at once and the warm-up counts from the first job
// consumed. -trace FILE writes each job's ADDJOB and GETJOB reply times
// (Unix µs), to match against a server's own timestamps.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/bench"
)

// seen pairs each job's ADDJOB reply with its GETJOB reply, whichever the
// process reads first (a fast cluster can deliver a job before its
// producer has read the ADDJOB reply).
type seen struct {
	mu    sync.Mutex
	added map[string]time.Time // ADDJOB replied, not consumed yet
	got   map[string]time.Time // consumed before its ADDJOB reply was read
	// measureFrom: jobs whose ADDJOB reply came before it are not
	// measured; it is set when priming ends, or else at the first job
	// consumed, plus the warm-up.
	measureFrom time.Time
	warmup      time.Duration
	hist        *bench.Histogram
	early       atomic.Int64 // GETJOB reply read before the ADDJOB reply
}

// measuredLocked: a job whose ADDJOB reply came at a is measured.
func (s *seen) measuredLocked(a time.Time) bool {
	return !s.measureFrom.IsZero() && !a.Before(s.measureFrom)
}

func (s *seen) add(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.got[id]; ok {
		delete(s.got, id)
		if s.measuredLocked(at) {
			s.hist.Record(0)
			s.early.Add(1)
		}
		return
	}
	s.added[id] = at
}

// startMeasuring measures the jobs whose ADDJOB reply comes at or after
// from (after priming; without it, the first job consumed sets it).
func (s *seen) startMeasuring(from time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.measureFrom = from
}

func (s *seen) consumed(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.measureFrom.IsZero() {
		s.measureFrom = at.Add(s.warmup)
	}
	a, ok := s.added[id]
	if !ok {
		s.got[id] = at
		return
	}
	delete(s.added, id)
	if s.measuredLocked(a) {
		s.hist.Record(at.Sub(a))
	}
}

func dial(addr string) (net.Conn, *bench.Reader, *bench.Writer) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crosslat:", err)
		os.Exit(1)
	}
	return c, bench.NewReader(bufio.NewReader(c)), bench.NewWriter(c)
}

func main() {
	produce := flag.String("produce", "127.0.0.1:7711", "node the producers add jobs on")
	consume := flag.String("consume", "127.0.0.1:7712", "node the consumers take jobs from")
	rate := flag.Int("rate", 2000, "jobs added per second, in all")
	duration := flag.Duration("duration", 10*time.Second, "how long the producers add")
	warmup := flag.Duration("warmup", time.Second, "jobs added in this first part of the paced load are not measured (without -prime: before the first job consumed, and this long after)")
	producers := flag.Int("producers", 4, "producer connections")
	consumers := flag.Int("consumers", 4, "consumer connections (blocking GETJOB)")
	count := flag.Int("count", 100, "GETJOB COUNT")
	replicate := flag.Int("replicate", 1, "ADDJOB REPLICATE")
	retry := flag.Int("retry", 60, "ADDJOB RETRY (seconds)")
	size := flag.Int("size", 100, "body bytes")
	queue := flag.String("queue", "crosslat", "queue name")
	prime := flag.Bool("prime", true, "before the paced producers, add unmeasured jobs until the consumers got one")
	tracePath := flag.String("trace", "", "write each job's ADDJOB and GETJOB reply times (Unix µs) to this file")
	flag.Parse()
	trace := newTracer(*tracePath)
	defer trace.close()

	s := &seen{added: map[string]time.Time{}, got: map[string]time.Time{}, warmup: *warmup, hist: bench.NewHistogram()}
	body := make([]byte, *size)
	for i := range body {
		body[i] = 'x'
	}
	// The consumers start first, so that priming finds them blocked.
	var addErrs, added, consumed atomic.Int64
	var stop atomic.Bool
	var cw sync.WaitGroup
	for range *consumers {
		c, r, w := dial(*consume)
		cw.Add(1)
		go func() {
			defer cw.Done()
			defer c.Close()
			for !stop.Load() {
				w.Command("GETJOB", "TIMEOUT", "200", "COUNT", strconv.Itoa(*count), "FROM", *queue)
				if err := w.Flush(); err != nil {
					fmt.Fprintln(os.Stderr, "crosslat: GETJOB:", err)
					os.Exit(1)
				}
				v, err := r.Read()
				at := time.Now()
				if err != nil {
					fmt.Fprintln(os.Stderr, "crosslat: GETJOB:", err)
					os.Exit(1)
				}
				if v.Kind != bench.KindArray || len(v.Array) == 0 {
					continue // timed out (or an error reply): ask again
				}
				ids := []string{"ACKJOB"}
				for _, j := range v.Array {
					if len(j.Array) >= 2 {
						id := j.Array[1].Str
						s.consumed(id, at)
						trace.record("G", id, at)
						ids = append(ids, id)
					}
				}
				consumed.Add(int64(len(ids) - 1))
				w.Command(ids...)
				if err := w.Flush(); err != nil {
					fmt.Fprintln(os.Stderr, "crosslat: ACKJOB:", err)
					os.Exit(1)
				}
				if _, err := r.Read(); err != nil {
					fmt.Fprintln(os.Stderr, "crosslat: ACKJOB:", err)
					os.Exit(1)
				}
			}
		}()
	}
	total := int64(*rate) * int64(duration.Seconds())
	var next atomic.Int64 // the next job's index, shared by the producers
	var pw sync.WaitGroup
	var primed int64
	if *prime {
		primed = primeSources(*produce, *queue, body, *replicate, *retry, &consumed)
		added.Add(primed)
		s.startMeasuring(time.Now().Add(*warmup))
	}
	start := time.Now().Add(100 * time.Millisecond)
	for range *producers {
		c, r, w := dial(*produce)
		pw.Add(1)
		go func() {
			defer pw.Done()
			defer c.Close()
			for {
				k := next.Add(1) - 1
				if k >= total {
					return
				}
				due := start.Add(time.Duration(k) * time.Second / time.Duration(*rate))
				if d := time.Until(due); d > 0 {
					time.Sleep(d) // pacing the load, not synchronising
				}
				w.Command("ADDJOB", *queue, string(body), "0", "REPLICATE", strconv.Itoa(*replicate), "RETRY", strconv.Itoa(*retry))
				if err := w.Flush(); err != nil {
					fmt.Fprintln(os.Stderr, "crosslat: ADDJOB:", err)
					os.Exit(1)
				}
				v, err := r.Read()
				at := time.Now()
				if err != nil {
					fmt.Fprintln(os.Stderr, "crosslat: ADDJOB:", err)
					os.Exit(1)
				}
				if v.Kind == bench.KindError {
					addErrs.Add(1)
					continue
				}
				added.Add(1)
				trace.record("A", v.Str, at)
				s.add(v.Str, at)
			}
		}()
	}
	pw.Wait()
	prodEnd := time.Now()
	// Drain: the consumers go on until every job added was consumed, or 10 s.
	for deadline := time.Now().Add(10 * time.Second); consumed.Load() < added.Load() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // polling the counters
	}
	drained := time.Now()
	stop.Store(true)
	cw.Wait()
	el := drained.Sub(start).Seconds()
	paced := consumed.Load() - primed
	h := s.hist
	fmt.Printf("rate=%d/s added=%d consumed=%d add_errors=%d produce=%.1fs consume_rate=%.0f jobs/s latency_p50=%.3fms p90=%.3fms p99=%.3fms max=%.3fms measured=%d early=%d\n",
		*rate, added.Load(), consumed.Load(), addErrs.Load(), prodEnd.Sub(start).Seconds(), float64(paced)/el,
		ms(h.Quantile(0.5)), ms(h.Quantile(0.9)), ms(h.Quantile(0.99)), ms(h.Max()), h.Count(), s.early.Load())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// primeSources adds one job every 50 ms on addr until the consumers have
// consumed one (30 s at most), so that the consumers' node knows the
// producers' node as a source of the queue before the measured load
// starts. It returns how many jobs it added.
func primeSources(addr, queue string, body []byte, replicate, retry int, consumed *atomic.Int64) int64 {
	c, r, w := dial(addr)
	defer c.Close()
	var n int64
	for deadline := time.Now().Add(30 * time.Second); consumed.Load() == 0 && time.Now().Before(deadline); {
		w.Command("ADDJOB", queue, string(body), "0", "REPLICATE", strconv.Itoa(replicate), "RETRY", strconv.Itoa(retry))
		if err := w.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, "crosslat: priming ADDJOB:", err)
			os.Exit(1)
		}
		v, err := r.Read()
		if err != nil {
			fmt.Fprintln(os.Stderr, "crosslat: priming ADDJOB:", err)
			os.Exit(1)
		}
		if v.Kind != bench.KindError {
			n++
		}
		time.Sleep(50 * time.Millisecond) // pacing the priming jobs, not synchronising
	}
	if consumed.Load() == 0 {
		fmt.Fprintln(os.Stderr, "crosslat: no job reached the consumers in 30 s")
		os.Exit(1)
	}
	return n
}

// tracer writes one line per ADDJOB or GETJOB reply ("A|G id unix-µs")
// when -trace is set; a nil *tracer writes nothing.
type tracer struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

func newTracer(path string) *tracer {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crosslat:", err)
		os.Exit(1)
	}
	return &tracer{w: bufio.NewWriter(f), f: f}
}

func (t *tracer) record(kind, id string, at time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	fmt.Fprintf(t.w, "%s %s %d\n", kind, id, at.UnixMicro())
	t.mu.Unlock()
}

func (t *tracer) close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "crosslat: trace:", err)
	}
	t.f.Close()
}
