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
// at the job's due time. Jobs added before the first job is consumed, and
// in the -warmup after it, are consumed but not measured: the consumers'
// node discovers its sources by a broadcast NEEDJOBS, which goes at most
// every 2 s doubling (CLUSTER.md "Federation"), so the first jobs can
// wait seconds for it — a start-up cost, not the steady latency.
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
	// measured; it is set at the first job consumed, plus the warm-up.
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
	warmup := flag.Duration("warmup", time.Second, "jobs added before the first job was consumed, and this long after, are not measured")
	producers := flag.Int("producers", 4, "producer connections")
	consumers := flag.Int("consumers", 4, "consumer connections (blocking GETJOB)")
	count := flag.Int("count", 100, "GETJOB COUNT")
	replicate := flag.Int("replicate", 1, "ADDJOB REPLICATE")
	retry := flag.Int("retry", 60, "ADDJOB RETRY (seconds)")
	size := flag.Int("size", 100, "body bytes")
	queue := flag.String("queue", "crosslat", "queue name")
	flag.Parse()

	s := &seen{added: map[string]time.Time{}, got: map[string]time.Time{}, warmup: *warmup, hist: bench.NewHistogram()}
	body := make([]byte, *size)
	for i := range body {
		body[i] = 'x'
	}
	var addErrs, added, consumed atomic.Int64
	start := time.Now().Add(100 * time.Millisecond)
	total := int64(*rate) * int64(duration.Seconds())
	var next atomic.Int64 // the next job's index, shared by the producers
	var pw sync.WaitGroup
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
				s.add(v.Str, at)
			}
		}()
	}
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
	h := s.hist
	fmt.Printf("rate=%d/s added=%d consumed=%d add_errors=%d produce=%.1fs consume_rate=%.0f jobs/s latency_p50=%.3fms p90=%.3fms p99=%.3fms max=%.3fms measured=%d early=%d\n",
		*rate, added.Load(), consumed.Load(), addErrs.Load(), prodEnd.Sub(start).Seconds(), float64(consumed.Load())/el,
		ms(h.Quantile(0.5)), ms(h.Quantile(0.9)), ms(h.Quantile(0.99)), ms(h.Max()), h.Count(), s.early.Load())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
