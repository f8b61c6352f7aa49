package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// budget hands out a shared number of operations to the clients in
// pieces; an unlimited budget hands out whatever is asked. Safe for
// concurrent use.
type budget struct {
	limited bool
	left    atomic.Int64
}

func newBudget(n int64) *budget {
	b := &budget{limited: n > 0}
	b.left.Store(n)
	return b
}

// take claims up to n operations and returns how many it got (0 when the
// budget is spent).
func (b *budget) take(n int) int {
	if !b.limited {
		return n
	}
	for {
		left := b.left.Load()
		if left <= 0 {
			return 0
		}
		k := min(int64(n), left)
		if b.left.CompareAndSwap(left, left-k) {
			return int(k)
		}
	}
}

// giveBack returns n claimed operations that were not done.
func (b *budget) giveBack(n int) {
	if b.limited && n > 0 {
		b.left.Add(int64(n))
	}
}

// runner is what the clients of one phase share.
type runner struct {
	opts     Options
	workload Workload
	body     []byte
	deadline time.Time // zero: none
	produce  *budget
	consume  *budget
	progress atomic.Int64 // operations completed, for the per-second samples

	// producersDone is closed once every producer of a mixed run returned.
	producersDone chan struct{}
}

func (r *runner) timeUp() bool {
	return !r.deadline.IsZero() && !time.Now().Before(r.deadline)
}

// producersFinished reports whether a consumer that finds the queue empty
// should stop: always outside mixed runs, and in mixed runs once no
// producer is left.
func (r *runner) producersFinished() bool {
	if r.workload != WorkloadMixed {
		return true
	}
	select {
	case <-r.producersDone:
		return true
	default:
		return false
	}
}

// Run connects opts.Clients connections to opts.Addr and runs the
// workload until the count or the duration is reached (a consume run also
// stops when the queue is empty). With Prefill, a consume run first adds
// that many jobs in an unmeasured produce phase.
//
// The Result is returned even with an error (it then covers what was done
// before the failure). Error replies from the server do not fail the run:
// they are counted in Result.Errors. A connection failing, a reply that is
// not RESP or not the expected shape, a GETJOB/RPOP error reply or a batch
// exceeding opts.Timeout fail it; so does ctx ending (the connections are
// closed at once).
func Run(ctx context.Context, opts Options) (*Result, error) {
	opts.ensureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	var prefilled int64
	if opts.Workload == WorkloadConsume && opts.Prefill > 0 {
		pre := opts
		pre.Workload, pre.Count, pre.Duration = WorkloadProduce, opts.Prefill, 0
		res, err := runPhase(ctx, pre)
		if err != nil {
			return nil, fmt.Errorf("bench: prefill: %w", err)
		}
		if res.Errors > 0 {
			return nil, fmt.Errorf("bench: prefill: %d error replies, first: %s", res.Errors, res.firstError())
		}
		prefilled = res.Produced
	}
	res, err := runPhase(ctx, opts)
	if res != nil {
		res.Prefilled = prefilled
	}
	return res, err
}

func runPhase(ctx context.Context, opts Options) (*Result, error) {
	r := &runner{
		opts:          opts,
		workload:      opts.Workload,
		body:          makeBody(opts.Body),
		producersDone: make(chan struct{}),
	}
	producers := 0 // clients [0, producers) produce, the rest consume
	switch opts.Workload {
	case WorkloadProduce, WorkloadDelayed:
		producers = opts.Clients
		r.produce, r.consume = newBudget(opts.Count), newBudget(0)
	case WorkloadConsume:
		r.produce, r.consume = newBudget(0), newBudget(opts.Count)
	case WorkloadMixed:
		producers = (opts.Clients + 1) / 2
		p := (opts.Count + 1) / 2
		r.produce, r.consume = newBudget(p), newBudget(opts.Count-p)
	}

	// Connect everything before the clock starts.
	clients := make([]*client, 0, opts.Clients)
	closeAll := func() {
		for _, c := range clients {
			c.conn.Close()
		}
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	for i := range opts.Clients {
		conn, err := d.DialContext(ctx, "tcp", opts.Addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("bench: connect client %d to %s: %w", i, opts.Addr, err)
		}
		clients = append(clients, newClient(r, conn))
	}
	defer closeAll()
	stopWatch := context.AfterFunc(ctx, closeAll)
	defer stopWatch()

	res := newResult(opts)
	start := time.Now()
	res.Start = start
	if opts.Duration > 0 {
		r.deadline = start.Add(opts.Duration)
	}

	// One sample of completed operations per whole second.
	sampleDone := make(chan struct{})
	var samples []int64
	printedProgress := false
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-sampleDone:
				return
			case <-t.C:
				now := r.progress.Load()
				samples = append(samples, now-last)
				last = now
				if opts.Progress != nil && time.Since(start) >= progressAfter {
					printedProgress = true
					fmt.Fprintf(opts.Progress, "\r%s", progressLine(opts, now, time.Since(start)))
				}
			}
		}
	})

	errs := make([]error, len(clients))
	var prod, cons sync.WaitGroup
	for i, c := range clients {
		if i < producers {
			prod.Go(func() { errs[i] = c.produceLoop() })
		} else {
			cons.Go(func() { errs[i] = c.consumeLoop() })
		}
	}
	prod.Wait()
	close(r.producersDone)
	cons.Wait()
	res.Elapsed = time.Since(start)
	close(sampleDone)
	sampler.Wait()
	res.PerSecond = samples
	if printedProgress {
		fmt.Fprintf(opts.Progress, "\r%s\n", progressLine(opts, r.progress.Load(), res.Elapsed))
	}

	for _, c := range clients {
		res.add(c)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	var failed []error
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("client %d: %w", i, err))
		}
	}
	if len(failed) > 0 {
		if len(failed) > 3 {
			failed = append(failed[:3], fmt.Errorf("and %d more clients failed", len(failed)-3))
		}
		return res, fmt.Errorf("bench: %s %s: %w", opts.Label, opts.Workload, errors.Join(failed...))
	}
	return res, nil
}

// makeBody returns n bytes of printable filler.
func makeBody(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

// loadAvg returns the 1, 5 and 15 minute load averages from /proc/loadavg,
// or "" where there is none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// progressAfter is how long a run lasts before it shows a progress line.
const progressAfter = 2 * time.Second

// progressLine is the live progress of a run: operations done out of the
// count (or time out of the duration), and the mean rate so far.
func progressLine(o Options, done int64, elapsed time.Duration) string {
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	of := ""
	switch {
	case o.Count > 0:
		of = fmt.Sprintf("/%d (%.0f%%)", o.Count, 100*float64(done)/float64(o.Count))
	case o.Duration > 0:
		of = fmt.Sprintf(" (%.0fs/%.0fs)", elapsed.Seconds(), o.Duration.Seconds())
	}
	return fmt.Sprintf("%s %s p%d: %d%s ops, %.0f ops/s   ", o.Label, o.Workload, o.Pipeline, done, of, rate)
}
