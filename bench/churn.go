package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ChurnOptions configures RunChurn.
type ChurnOptions struct {
	// ServerBin is the diskque-server binary. Default "bin/diskque-server".
	ServerBin string
	// Args are the server's flags after --port, --bind and --dir (e.g.
	// "--appendfsync", "everysec", "--gc-interval", "1"). Default none.
	Args []string
	// Backlog is the number of delayed jobs that sit beside the churn.
	// Default 100 000.
	Backlog int64
	// Count is the number of jobs added, delivered and acknowledged by the
	// churn. Default 2 000 000.
	Count int64
	// BodySize is every job's body size in bytes. Default 1024.
	BodySize int
	// Horizon is the span the backlog's delays are spread over. Default 30
	// days.
	Horizon time.Duration
	// Clients, Pipeline and Timeout are as in Options for the fill and the
	// churn (defaults 50, 16, 60s).
	Clients  int
	Pipeline int
	Timeout  time.Duration
	// BacklogQueue and Queue are the queues of the backlog and of the
	// churn. Defaults "backlog" and "churn".
	BacklogQueue string
	Queue        string
	// SegmentSize is the server's AOF segment size, for the bound. Default:
	// the last --aof-segment-size in Args, else 64 MiB (the server's
	// default; a size set in a config file is not seen).
	SegmentSize int64
	// CatchUp is how long the catch-up waits without the data directory
	// shrinking (by 1% of its smallest size so far) before it gives up.
	// Default 2 minutes.
	CatchUp time.Duration
	// Poll is how often the data directory is measured during the churn and
	// the catch-up. Default 1s.
	Poll time.Duration
	// ScanCount is the JSCAN COUNT of the verification's pages. Default 1000.
	ScanCount int
	// ReadyTimeout bounds the first start and the restart. Default 5m.
	ReadyTimeout time.Duration
	// Progress, if not nil, receives a line per step and per catch-up poll;
	// RunProgress is the fill's and the churn's Options.Progress.
	Progress    io.Writer
	RunProgress io.Writer
}

func (o *ChurnOptions) ensureDefaults() {
	if o.ServerBin == "" {
		o.ServerBin = "bin/diskque-server"
	}
	if o.Backlog == 0 {
		o.Backlog = 100_000
	}
	if o.Count == 0 {
		o.Count = 2_000_000
	}
	if o.BodySize == 0 {
		o.BodySize = 1024
	}
	if o.Horizon == 0 {
		o.Horizon = DefaultHorizon
	}
	if o.Clients == 0 {
		o.Clients = 50
	}
	if o.Pipeline == 0 {
		o.Pipeline = 16
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.BacklogQueue == "" {
		o.BacklogQueue = "backlog"
	}
	if o.Queue == "" {
		o.Queue = "churn"
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = segmentSizeFromArgs(o.Args)
	}
	if o.CatchUp == 0 {
		o.CatchUp = 2 * time.Minute
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if o.ScanCount == 0 {
		o.ScanCount = 1000
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 5 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

func (o *ChurnOptions) validate() error {
	switch {
	case o.Backlog < 0 || o.Count < 0:
		return errors.New("bench: churn: backlog and count must not be negative")
	case o.BodySize < 0:
		return errors.New("bench: churn: body size must not be negative")
	case o.Clients < 2:
		return errors.New("bench: churn: needs at least 2 clients (half produce, half consume)")
	case o.BacklogQueue == o.Queue:
		return errors.New("bench: churn: the backlog and the churn need different queues")
	case o.SegmentSize <= 0:
		return errors.New("bench: churn: segment size must be positive")
	}
	return nil
}

// defaultSegmentSize is diskque-server's default aof-segment-size.
const defaultSegmentSize = 64 << 20

// segmentSizeFromArgs returns the last --aof-segment-size in args (as
// "--aof-segment-size V" or "--aof-segment-size=V"), else the server's
// default. A value it cannot read is left to the server to refuse.
func segmentSizeFromArgs(args []string) int64 {
	size := int64(defaultSegmentSize)
	for i, a := range args {
		var v string
		if rest, ok := strings.CutPrefix(a, "--aof-segment-size="); ok {
			v = rest
		} else if a == "--aof-segment-size" && i+1 < len(args) {
			v = args[i+1]
		} else {
			continue
		}
		if n, err := parseSize(v); err == nil && n > 0 {
			size = n
		}
	}
	return size
}

// parseSize reads a size as diskque-server's config does (Redis's units):
// a number of bytes, or with k = 1000, kb = 1024, m, mb, g, gb, b.
func parseSize(v string) (int64, error) {
	lower := strings.ToLower(v)
	mul := int64(1)
	for _, u := range []struct {
		suffix string
		mul    int64
	}{{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"b", 1}} {
		if num, ok := strings.CutSuffix(lower, u.suffix); ok {
			lower, mul = num, u.mul
			break
		}
	}
	n, err := strconv.ParseInt(lower, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mul {
		return 0, fmt.Errorf("bench: %q is not a size", v)
	}
	return n * mul, nil
}

// BacklogCheck is what one scan of the backlog queue found.
type BacklogCheck struct {
	// Jobs is the number of distinct jobs of the backlog queue found.
	Jobs int64
	// Delayed is how many of them still wait for their delay (the others
	// became due during the run and are queued: still intact, still there).
	Delayed int64
	// Intact is how many had exactly the body the fill sent.
	Intact int64
	// Elapsed is the scan's wall time.
	Elapsed time.Duration
}

// ok reports whether the scan found want jobs, all intact.
func (c BacklogCheck) ok(want int64) bool { return c.Jobs == want && c.Intact == want }

// ChurnResult is what RunChurn measured.
type ChurnResult struct {
	// Fill is the backlog fill's Result, Churn the mixed run's.
	Fill  *Result
	Churn *Result
	// Produced and Consumed count the churn's jobs added and acknowledged
	// (the latter including a drain after the mixed run, if one was needed).
	Produced int64
	Consumed int64
	// Drained is how many jobs the drain took after the mixed run (0 when
	// the mixed run's consumers took them all).
	Drained int64
	// ChurnLeft is the number of churn jobs neither acknowledged nor gone
	// once the churn was over (JSCAN QUEUE churn; it must be 0).
	ChurnLeft int64

	// LiveBytes is Backlog × BodySize; SegmentSize is the server's AOF
	// segment size; Bound is 3 × LiveBytes + 2 × SegmentSize.
	LiveBytes   int64
	SegmentSize int64
	Bound       int64

	// Data directory sizes: after the backlog fill, the largest sampled
	// during the churn (at PeakAt after its start), at the end of the
	// churn, and at the end of the catch-up.
	FilledBytes int64
	PeakBytes   int64
	PeakAt      time.Duration
	AfterChurn  int64
	FinalBytes  int64
	CatchUpTime time.Duration
	// CatchUpPeak is the largest size sampled during the catch-up: a
	// checkpoint flushes the index before the segments it frees go, so
	// the directory may grow for a moment before it shrinks.
	CatchUpPeak   int64
	ChurnDuration time.Duration // mixed run and drain
	// Pass says FinalBytes ≤ Bound.
	Pass bool
	// Storage is the last INFO Storage section seen (key:value lines;
	// empty if the server has none).
	Storage []string
	// StoredLive is INFO Storage's live_bytes after the catch-up (-1 if
	// absent): the live bodies as the AOF holds them. The bench's bodies
	// are a repeated alphabet, so where the server compresses bodies (s2,
	// from 1 KiB by default) this is far below LiveBytes.
	StoredLive int64

	// Verify is the backlog scan before the kill, Restarted the one after.
	Verify    BacklogCheck
	Restarted BacklogCheck

	// RSSBytes is the server's VmRSS just before the kill, RestartRSS the
	// restarted server's after its verification (-1 where unavailable).
	RSSBytes   int64
	RestartRSS int64
	// KilledBytes is the data directory just after the SIGKILL.
	KilledBytes int64
	// Ready is the time from the restart's exec to PING answering and INFO
	// saying loading:0.
	Ready time.Duration
	// ChurnQLENAfter is the churn queue's QLEN after the restart: jobs whose
	// acknowledgement the kill lost, which appendfsync everysec or no allow
	// for acks made in the last moments before it (normally 0: the catch-up
	// and the verification come between the last ack and the kill).
	ChurnQLENAfter int64
}

// RunChurn is the collector's proof benchmark. It starts ServerBin on a
// temporary directory, fills a backlog of Backlog delayed jobs, then churns
// Count jobs through another queue (added, delivered, acknowledged by the
// mixed workload) while sampling the data directory, waits for the
// collector to bring the directory under Bound (or to stop shrinking for
// CatchUp), verifies every backlog job with JSCAN, SIGKILLs the server,
// restarts it on the same directory and verifies the backlog again. The
// restarted server is stopped with SIGTERM and the directory removed
// before RunChurn returns.
//
// A data directory over the bound is reported (Pass false), not an error:
// the figures are the point. A lost or damaged backlog job is an error.
func RunChurn(ctx context.Context, o ChurnOptions) (res *ChurnResult, err error) {
	o.ensureDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	sc, err := startScratch(ctx, "diskque-churn-", o.ServerBin, o.Args, o.ReadyTimeout, o.Progress)
	if err != nil {
		return nil, err
	}
	defer sc.close(&err)
	srv, dir := sc.srv, sc.cfg.Dir

	res = &ChurnResult{RSSBytes: -1, RestartRSS: -1, StoredLive: -1, SegmentSize: o.SegmentSize}
	res.LiveBytes = o.Backlog * int64(o.BodySize)
	res.Bound = 3*res.LiveBytes + 2*o.SegmentSize

	// 1. The backlog.
	if o.Backlog > 0 {
		fill := Options{
			Addr: srv.Addr, Target: TargetDiskque, Workload: WorkloadDelayed, Label: "churn backlog",
			Clients: o.Clients, Pipeline: o.Pipeline, Body: o.BodySize, Count: o.Backlog,
			Queue: o.BacklogQueue, Timeout: o.Timeout, Horizon: o.Horizon, Progress: o.RunProgress,
		}
		res.Fill, err = Run(ctx, fill)
		if err != nil {
			return res, fmt.Errorf("bench: churn: backlog: %w", err)
		}
		if res.Fill.Errors > 0 {
			return res, fmt.Errorf("bench: churn: backlog: %d error replies, first: %s", res.Fill.Errors, res.Fill.firstError())
		}
	}
	res.FilledBytes = dirSize(dir)
	fmt.Fprintf(o.Progress, "backlog: %d delayed jobs of %d bytes (over %v) in %.2fs; data dir %s\n",
		o.Backlog, o.BodySize, o.Horizon, fillElapsed(res.Fill).Seconds(), mb(res.FilledBytes))

	// 2. The churn.
	if err := o.churn(ctx, srv.Addr, dir, res); err != nil {
		return res, err
	}
	fmt.Fprintf(o.Progress, "churn: %d jobs added, %d acked in %.2fs (%.0f jobs/s); data dir peak %s at %.0fs, %s at the end\n",
		res.Produced, res.Consumed, res.ChurnDuration.Seconds(), float64(res.Consumed)/max(res.ChurnDuration.Seconds(), 1e-9),
		mb(res.PeakBytes), res.PeakAt.Seconds(), mb(res.AfterChurn))

	// 3. The catch-up.
	if err := o.catchUp(ctx, srv.Addr, dir, res); err != nil {
		return res, err
	}
	verdict := "PASS"
	if !res.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(o.Progress, "catch-up: data dir %s after %.1fs, bound %s (3 × %s live + 2 × %s segments): %s\n",
		mb(res.FinalBytes), res.CatchUpTime.Seconds(), mb(res.Bound), mb(res.LiveBytes), mb(res.SegmentSize), verdict)

	// 4. The backlog, before the kill.
	body := string(makeBody(o.BodySize))
	if res.Verify, err = o.scanBacklog(srv.Addr, body); err != nil {
		return res, err
	}
	fmt.Fprintf(o.Progress, "verified: %d/%d backlog jobs intact (%d still delayed) in %.2fs\n",
		res.Verify.Intact, o.Backlog, res.Verify.Delayed, res.Verify.Elapsed.Seconds())
	if !res.Verify.ok(o.Backlog) {
		return res, fmt.Errorf("bench: churn: backlog before the restart: %d jobs found, %d intact; want %d",
			res.Verify.Jobs, res.Verify.Intact, o.Backlog)
	}

	// 5. SIGKILL and restart.
	if res.RSSBytes, res.KilledBytes, err = sc.kill(); err != nil {
		return res, err
	}
	fmt.Fprintf(o.Progress, "killed (SIGKILL) with RSS %s; data dir %s; restarting\n", mb(res.RSSBytes), mb(res.KilledBytes))
	if lines, n := srv.Notable(); n > 0 {
		fmt.Fprintf(o.Progress, "the server logged %d warnings or errors, first: %q\n", n, lines)
	}
	srv2, err := sc.restart()
	if err != nil {
		return res, err
	}
	// waitServing with a delayed fill waits for INFO loading:0 and reads
	// the QLEN of the queue named: the churn's, which should be empty.
	var ready RestartResult
	wait := RestartOptions{Fill: WorkloadDelayed, Queue: o.Queue, ReadyTimeout: o.ReadyTimeout}
	if err := srv2.waitServing(ctx, wait, &ready); err != nil {
		return res, fmt.Errorf("bench: churn: restart: %w; its output ends:\n%s", err, srv2.Output())
	}
	res.Ready, res.ChurnQLENAfter = ready.Ready, ready.After
	if res.Restarted, err = o.scanBacklog(srv2.Addr, body); err != nil {
		return res, err
	}
	if rss, err := processRSS(srv2.Pid()); err == nil {
		res.RestartRSS = rss
	}
	fmt.Fprintf(o.Progress, "restarted: ready after %v (RSS %s); %d/%d backlog jobs intact (%d still delayed); churn QLEN %d\n",
		res.Ready.Round(time.Millisecond), mb(res.RestartRSS), res.Restarted.Intact, o.Backlog, res.Restarted.Delayed, res.ChurnQLENAfter)
	if !res.Restarted.ok(o.Backlog) {
		return res, fmt.Errorf("bench: churn: backlog after the restart: %d jobs found, %d intact; want %d",
			res.Restarted.Jobs, res.Restarted.Intact, o.Backlog)
	}
	return res, nil
}

func fillElapsed(r *Result) time.Duration {
	if r == nil {
		return 0
	}
	return r.Elapsed
}

// churn runs Count jobs through the churn queue and samples the data
// directory every Poll meanwhile.
func (o *ChurnOptions) churn(ctx context.Context, addr, dir string, res *ChurnResult) error {
	start := time.Now()
	// peak and at belong to the sampler goroutine until sampler.Wait, and
	// to this one after.
	peak, at := dirSize(dir), time.Duration(0)
	sample := func() {
		if n := dirSize(dir); n > peak {
			peak, at = n, time.Since(start)
		}
	}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(o.Poll)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
			}
		}
	})
	err := o.runChurn(ctx, addr, res)
	close(stop)
	sampler.Wait()
	sample()
	res.ChurnDuration = time.Since(start)
	res.PeakBytes, res.PeakAt = peak, at
	res.AfterChurn = dirSize(dir)
	return err
}

// runChurn is the churn itself: a mixed run whose producers add exactly
// Count jobs, then a drain of whatever the consumers left, then a check
// that no churn job is left unacknowledged.
func (o *ChurnOptions) runChurn(ctx context.Context, addr string, res *ChurnResult) error {
	if o.Count == 0 {
		return nil
	}
	// Mixed splits its count between producers (ceil(Count/2)) and
	// consumers: twice Count makes the producers add exactly Count.
	mixed := Options{
		Addr: addr, Target: TargetDiskque, Workload: WorkloadMixed, Label: "churn",
		Clients: o.Clients, Pipeline: o.Pipeline, Body: o.BodySize, Count: 2 * o.Count,
		Queue: o.Queue, Timeout: o.Timeout, Progress: o.RunProgress,
	}
	var err error
	res.Churn, err = Run(ctx, mixed)
	if err != nil {
		return fmt.Errorf("bench: churn: %w", err)
	}
	if res.Churn.Errors > 0 {
		return fmt.Errorf("bench: churn: %d error replies, first: %s", res.Churn.Errors, res.Churn.firstError())
	}
	res.Produced, res.Consumed = res.Churn.Produced, res.Churn.Consumed
	if res.Produced != o.Count {
		return fmt.Errorf("bench: churn: %d jobs added, want %d", res.Produced, o.Count)
	}
	// A consumer stops when it finds the queue empty after the producers
	// finished, so normally the consumers took everything; should any job
	// be left queued, a consume run takes it.
	if left := res.Produced - res.Consumed; left > 0 {
		drain, err := Run(ctx, Options{
			Addr: addr, Target: TargetDiskque, Workload: WorkloadConsume, Label: "churn drain",
			Clients: o.Clients, Pipeline: o.Pipeline, Count: left, Queue: o.Queue, Timeout: o.Timeout,
		})
		if err != nil {
			return fmt.Errorf("bench: churn: drain: %w", err)
		}
		if drain.Errors > 0 {
			return fmt.Errorf("bench: churn: drain: %d error replies, first: %s", drain.Errors, drain.firstError())
		}
		res.Drained = drain.Consumed
		res.Consumed += drain.Consumed
	}
	// Wait (polling, bounded by Timeout) until the churn queue is empty and
	// no churn job is left in any live state.
	deadline := time.Now().Add(o.Timeout)
	for {
		n, err := QueueLen(addr, TargetDiskque, o.Queue)
		if err != nil {
			return err
		}
		if n == 0 {
			if res.ChurnLeft, err = o.countChurnLeft(addr); err != nil {
				return err
			}
			if res.ChurnLeft == 0 && res.Consumed == res.Produced {
				return nil
			}
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("bench: churn: after %v: QLEN %d, %d churn jobs unacknowledged, %d of %d acked",
				o.Timeout, n, res.ChurnLeft, res.Consumed, res.Produced)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// countChurnLeft counts the churn queue's jobs that are still live
// (waiting for replication, active — delivered or delayed — or queued).
func (o *ChurnOptions) countChurnLeft(addr string) (int64, error) {
	var n int64
	cursor := "0"
	for {
		replies, err := Do(addr, o.Timeout, []string{"JSCAN", cursor, "COUNT", "10000", "QUEUE", o.Queue,
			"STATE", "wait-repl", "STATE", "active", "STATE", "queued", "REPLY", "id"})
		if err != nil {
			return -1, err
		}
		next, items, err := scanPage(replies[0])
		if err != nil {
			return -1, err
		}
		n += int64(len(items))
		if cursor = next; cursor == "0" {
			return n, nil
		}
	}
}

// scanPage splits a JSCAN reply into its cursor and items.
func scanPage(v Value) (string, []Value, error) {
	if v.Kind == KindError {
		return "", nil, fmt.Errorf("bench: JSCAN: -%s", v.Str)
	}
	if v.Kind != KindArray || len(v.Array) != 2 || v.Array[0].Kind != KindBulk || v.Array[1].Kind != KindArray {
		return "", nil, fmt.Errorf("bench: JSCAN: unexpected reply %.200s", v)
	}
	return v.Array[0].Str, v.Array[1].Array, nil
}

// scanBacklog walks the backlog queue with JSCAN … REPLY all and checks
// each job's body against body. It scans every state rather than STATE
// delayed: a job whose delay came due during the run (or was drawn as 0)
// is queued, not delayed, yet it is as much a backlog job that must
// survive.
func (o *ChurnOptions) scanBacklog(addr, body string) (BacklogCheck, error) {
	start := time.Now()
	var c BacklogCheck
	seen := make(map[string]struct{}, o.Backlog)
	cursor := "0"
	for {
		replies, err := Do(addr, o.Timeout, []string{"JSCAN", cursor, "COUNT", strconv.Itoa(o.ScanCount),
			"QUEUE", o.BacklogQueue, "REPLY", "all"})
		if err != nil {
			return c, fmt.Errorf("bench: churn: verify: %w", err)
		}
		next, items, err := scanPage(replies[0])
		if err != nil {
			return c, fmt.Errorf("bench: churn: verify: %w", err)
		}
		for _, it := range items {
			f := showFields(it)
			id, ok := f["id"]
			if !ok || id.Kind != KindBulk {
				return c, fmt.Errorf("bench: churn: verify: a JSCAN item without an id: %.200s", it)
			}
			if _, dup := seen[id.Str]; dup {
				continue // a scan may return a job twice; count it once
			}
			seen[id.Str] = struct{}{}
			c.Jobs++
			if b := f["body"]; b.Kind == KindBulk && !b.Null && b.Str == body {
				c.Intact++
			}
			if w := f["next-awake-within"]; w.Kind == KindInt {
				c.Delayed++
			}
		}
		if cursor = next; cursor == "0" {
			break
		}
	}
	c.Elapsed = time.Since(start)
	return c, nil
}

// showFields maps a SHOW-style array's field names to their values.
func showFields(v Value) map[string]Value {
	m := make(map[string]Value, len(v.Array)/2)
	for i := 0; i+1 < len(v.Array); i += 2 {
		if k := v.Array[i]; k.Kind == KindBulk {
			m[k.Str] = v.Array[i+1]
		}
	}
	return m
}

// catchUp polls the data directory every Poll until it is within the
// bound, or has not shrunk by 1% of its smallest size so far for CatchUp:
// sub-percent changes are the index's own churn, not the collector's work.
func (o *ChurnOptions) catchUp(ctx context.Context, addr, dir string, res *ChurnResult) error {
	start := time.Now()
	best, lastShrink := int64(math.MaxInt64), start
	var lastLine string
	var lastPrint time.Time
	t := time.NewTicker(o.Poll)
	defer t.Stop()
	for {
		size := dirSize(dir)
		if lines, err := storageInfo(addr); err == nil && len(lines) > 0 {
			res.Storage = lines
			for _, l := range lines {
				if v, ok := strings.CutPrefix(l, "live_bytes:"); ok {
					if n, err := strconv.ParseInt(v, 10, 64); err == nil {
						res.StoredLive = n
					}
				}
			}
		}
		elapsed := time.Since(start)
		// A line when something changed, else one every 10s, so a long
		// wait for the next checkpoint does not flood the output.
		line := fmt.Sprintf("data dir %s (bound %s) %s", mb(size), mb(res.Bound), strings.Join(res.Storage, " "))
		if line != lastLine || time.Since(lastPrint) >= 10*time.Second {
			fmt.Fprintf(o.Progress, "catch-up %5.1fs: %s\n", elapsed.Seconds(), line)
			lastLine, lastPrint = line, time.Now()
		}
		if size <= best-best/100 {
			best, lastShrink = size, time.Now()
		}
		res.FinalBytes, res.CatchUpTime = size, elapsed
		res.CatchUpPeak = max(res.CatchUpPeak, size)
		if size <= res.Bound {
			res.Pass = true
			return nil
		}
		if time.Since(lastShrink) >= o.CatchUp {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// storageInfo returns the key:value lines of INFO's Storage section (none
// if the server has no such section).
func storageInfo(addr string) ([]string, error) {
	replies, err := Do(addr, 10*time.Second, []string{"INFO", "storage"})
	if err != nil {
		return nil, err
	}
	v := replies[0]
	if v.Kind != KindBulk {
		return nil, fmt.Errorf("bench: INFO storage: %v", v)
	}
	var lines []string
	in := false
	for l := range strings.Lines(v.Str) {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "#"):
			in = strings.EqualFold(strings.TrimSpace(l[1:]), "storage")
		case in && l != "":
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// mb formats a byte count in MB (10⁶), as RestartTable does, or in kB
// below 1 MB so that small runs still show their figures; negative
// (unknown) counts print as "n/a".
func mb(n int64) string {
	switch {
	case n < 0:
		return "n/a"
	case n < 1e6:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}

// ChurnTable formats r as a markdown table.
func ChurnTable(o ChurnOptions, r *ChurnResult) string {
	o.ensureDefaults()
	var b strings.Builder
	b.WriteString("| measure | value |\n|---|--:|\n")
	if r.Fill != nil {
		fmt.Fprintf(&b, "| backlog: delayed jobs over %v (clients %d, pipeline %d, body %d) | %d in %.2fs = %.0f/s |\n",
			o.Horizon, r.Fill.Clients, r.Fill.Pipeline, r.Fill.Body, r.Fill.Produced, r.Fill.Elapsed.Seconds(), r.Fill.OpsPerSec())
	}
	if r.Churn != nil {
		fmt.Fprintf(&b, "| churn: jobs added, delivered and acked (clients %d, pipeline %d, body %d) | %d added, %d acked in %.2fs = %.0f jobs/s |\n",
			r.Churn.Clients, r.Churn.Pipeline, r.Churn.Body, r.Produced, r.Consumed, r.ChurnDuration.Seconds(),
			float64(r.Consumed)/max(r.ChurnDuration.Seconds(), 1e-9))
		fmt.Fprintf(&b, "| churn: p99 per job (ADDJOB; GETJOB to ACKJOB reply) | %s ms |\n", fmtMs(r.Churn.Latency.Quantile(0.99)))
	}
	if r.Drained > 0 {
		fmt.Fprintf(&b, "| churn: jobs left by the mixed run and drained after | %d |\n", r.Drained)
	}
	fmt.Fprintf(&b, "| data directory after the backlog fill | %s |\n", mb(r.FilledBytes))
	fmt.Fprintf(&b, "| data directory peak during the churn (sampled every %v) | %s at %.0fs |\n", o.Poll, mb(r.PeakBytes), r.PeakAt.Seconds())
	fmt.Fprintf(&b, "| data directory at the end of the churn | %s |\n", mb(r.AfterChurn))
	fmt.Fprintf(&b, "| data directory peak during the catch-up | %s |\n", mb(r.CatchUpPeak))
	fmt.Fprintf(&b, "| data directory after the catch-up | %s after %.1fs |\n", mb(r.FinalBytes), r.CatchUpTime.Seconds())
	fmt.Fprintf(&b, "| bound: 3 × live (%s) + 2 × segment (%s) | %s |\n", mb(r.LiveBytes), mb(r.SegmentSize), mb(r.Bound))
	verdict := "**pass**"
	if !r.Pass {
		verdict = "**fail**"
	}
	fmt.Fprintf(&b, "| data directory within the bound | %s (%.2f × bound) |\n", verdict, float64(r.FinalBytes)/max(float64(r.Bound), 1))
	if r.StoredLive >= 0 {
		fmt.Fprintf(&b, "| live bodies as stored in the AOF (INFO live_bytes) | %s |\n", mb(r.StoredLive))
	}
	if len(r.Storage) > 0 {
		fmt.Fprintf(&b, "| INFO Storage after the catch-up | %s |\n", strings.Join(r.Storage, " "))
	}
	fmt.Fprintf(&b, "| backlog intact before the kill (still delayed) | %d/%d (%d) in %.2fs |\n",
		r.Verify.Intact, o.Backlog, r.Verify.Delayed, r.Verify.Elapsed.Seconds())
	fmt.Fprintf(&b, "| server RSS before the kill (VmRSS) | %s |\n", mb(r.RSSBytes))
	fmt.Fprintf(&b, "| data directory after the kill | %s |\n", mb(r.KilledBytes))
	fmt.Fprintf(&b, "| exec to ready (PING, INFO loading:0) | %s ms |\n", fmtMs(r.Ready))
	fmt.Fprintf(&b, "| backlog intact after the restart (still delayed) | %d/%d (%d) in %.2fs |\n",
		r.Restarted.Intact, o.Backlog, r.Restarted.Delayed, r.Restarted.Elapsed.Seconds())
	fmt.Fprintf(&b, "| restarted server RSS after the verification | %s |\n", mb(r.RestartRSS))
	fmt.Fprintf(&b, "| churn QLEN after the restart | %d |\n", r.ChurnQLENAfter)
	return b.String()
}
