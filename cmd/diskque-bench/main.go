// Command diskque-bench measures a diskque (or redis) server's throughput
// and latency, or with --matrix starts servers in every persistence mode
// and compares them, or with --churn runs the segment collector's proof
// benchmark (a delayed backlog beside a churn of acked jobs, the data
// directory against its bound, the backlog verified across a SIGKILL).
// The work is done by package bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/diskque/diskque/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "diskque-bench: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	d := bench.DefaultOptions()
	var (
		addr      = flag.String("addr", d.Addr, "server address")
		target    = flag.String("target", string(d.Target), "server kind: diskque or redis")
		workload  = flag.String("workload", string(d.Workload), "produce, consume, mixed, delayed (ADDJOB DELAY spread over --horizon) or restart (start --server, fill --count jobs, SIGKILL, time the restart)")
		clients   = flag.Int("clients", d.Clients, "connections, one goroutine each")
		pipeline  = flag.Int("pipeline", d.Pipeline, "pipeline depth (consume: GETJOB COUNT)")
		body      = flag.Int("body", d.Body, "job body size in bytes")
		count     = flag.Int64("count", 0, "operations to run (default 100000 when --duration is not set)")
		duration  = flag.Duration("duration", 0, "run for this long (with --count: whichever comes first)")
		queue     = flag.String("queue", d.Queue, "queue name (redis: list key)")
		prefill   = flag.Int64("prefill", -1, "consume: jobs to add first, unmeasured (-1: --count)")
		timeout   = flag.Duration("timeout", d.Timeout, "fail when one batch takes longer than this")
		jsonPath  = flag.String("json", "", "append one JSON line per run to this file")
		matrix    = flag.Bool("matrix", false, "start diskque in every persistence mode and redis, run produce and consume at pipeline 1 and 16 against each, print a comparison")
		serverBin = flag.String("server", "bin/diskque-server", "--matrix, restart and --churn: diskque-server binary")
		redisBin  = flag.String("redis", "/usr/bin/redis-server", "--matrix: redis-server binary")
		horizon   = flag.Duration("horizon", bench.DefaultHorizon, "delayed: spread the delays uniformly over this span")
		fill      = flag.String("fill", "produce", "restart: fill with produce (ready jobs) or delayed (over --horizon)")
		srvArgs   = flag.String("server-args", "", "restart and --churn: extra diskque-server flags, space-separated (e.g. \"--appendfsync always\")")
		progress  = flag.Bool("progress", false, "show a progress line on stderr for runs over 2s (default: only when stderr is a terminal)")
		modes     = flag.String("modes", strings.Join(bench.ModeKeys, ","), "--matrix: the modes to run, comma-separated")
		chart     = flag.String("chart", "", "--matrix: write a grouped bar chart of ops/s to this .svg or .png file")
		chartP99  = flag.String("chart-p99", "", "--matrix: write a grouped bar chart of p99 latency to this .svg or .png file")
		churn     = flag.Bool("churn", false, "start --server with --server-args, add --backlog delayed jobs (over --horizon), churn --count jobs (added, delivered, acked; default 2000000) of --body bytes (default 1024) beside them, wait up to --catch-up for the data directory to fall within 3 × live + 2 segments, verify the backlog, SIGKILL, restart, verify again")
		backlog   = flag.Int64("backlog", 100_000, "--churn: delayed jobs that sit beside the churn")
		catchUp   = flag.Duration("catch-up", 2*time.Minute, "--churn: give up waiting for the collector once the data directory has not shrunk for this long")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *count == 0 && *duration == 0 {
		*count = d.Count
	}
	var live io.Writer
	if *progress || isTerminal(os.Stderr) {
		live = os.Stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var jsonOut *os.File
	if *jsonPath != "" {
		f, err := os.OpenFile(*jsonPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		jsonOut = f
	}

	if *churn {
		// Flags left unset take the churn's own defaults (bench.ChurnOptions),
		// not those of a single run: 2M jobs of 1 KiB, pipeline 16.
		o := bench.ChurnOptions{
			ServerBin: *serverBin, Args: strings.Fields(*srvArgs), Backlog: *backlog,
			Clients: *clients, Horizon: *horizon, Timeout: *timeout, CatchUp: *catchUp,
			Progress: os.Stderr, RunProgress: live,
		}
		if set["count"] {
			o.Count = *count
		}
		if set["body"] {
			o.BodySize = *body
		}
		if set["pipeline"] {
			o.Pipeline = *pipeline
		}
		if set["queue"] {
			o.Queue = *queue
		}
		res, err := bench.RunChurn(ctx, o)
		if res != nil {
			fmt.Print(bench.ChurnTable(o, res))
			if jsonOut != nil {
				for _, r := range []*bench.Result{res.Fill, res.Churn} {
					if r != nil {
						err = errors.Join(err, bench.WriteJSONLine(jsonOut, r))
					}
				}
			}
			// The bound is the benchmark's verdict: a directory over it
			// fails the command, so scripts need not parse the table.
			if err == nil && !res.Pass {
				err = fmt.Errorf("churn: data directory %d bytes after the catch-up, over its bound of %d", res.FinalBytes, res.Bound)
			}
		}
		return err
	}

	if *matrix {
		ms, err := bench.ModesByKey(strings.Split(*modes, ","))
		if err != nil {
			return err
		}
		m := bench.MatrixOptions{
			ServerBin: *serverBin, RedisBin: *redisBin, Modes: ms,
			Clients: *clients, Body: *body, Count: *count, Duration: *duration, Timeout: *timeout,
			Progress: os.Stderr, LiveProgress: live,
		}
		if jsonOut != nil {
			m.JSON = jsonOut
		}
		results, err := bench.RunMatrix(ctx, m)
		if len(results) > 0 {
			fmt.Print(bench.MatrixTable(results))
			for _, c := range []struct {
				path   string
				metric bench.ChartMetric
			}{{*chart, bench.ChartOpsPerSec}, {*chartP99, bench.ChartP99}} {
				if c.path != "" {
					err = errors.Join(err, bench.WriteChart(c.path, results, c.metric))
				}
			}
		}
		return err
	}

	t, err := bench.ParseTarget(*target)
	if err != nil {
		return err
	}
	w, err := bench.ParseWorkload(*workload)
	if err != nil {
		return err
	}
	if w == bench.WorkloadRestart {
		f, err := bench.ParseWorkload(*fill)
		if err != nil {
			return err
		}
		o := bench.RestartOptions{
			ServerBin: *serverBin, Args: strings.Fields(*srvArgs), Fill: f, Count: *count,
			Clients: *clients, Pipeline: *pipeline, Body: *body, Horizon: *horizon, Timeout: *timeout,
			Progress: os.Stderr, FillProgress: live,
		}
		if *queue != d.Queue {
			o.Queue = *queue
		}
		res, err := bench.RunRestart(ctx, o)
		if res != nil {
			fmt.Print(bench.RestartTable(o, res))
			if jsonOut != nil && res.Fill != nil {
				if err := bench.WriteJSONLine(jsonOut, res.Fill); err != nil {
					return err
				}
			}
		}
		return err
	}
	opts := bench.Options{
		Addr: *addr, Target: t, Workload: w, Clients: *clients, Pipeline: *pipeline, Body: *body,
		Count: *count, Duration: *duration, Queue: *queue, Timeout: *timeout, Prefill: *prefill,
		Horizon: *horizon, Progress: live,
	}
	if opts.Prefill < 0 {
		opts.Prefill = 0
		if w == bench.WorkloadConsume {
			opts.Prefill = *count
		}
	}
	res, runErr := bench.Run(ctx, opts)
	if res != nil {
		fmt.Print(bench.RunTableHeader, bench.RunTableRow(res))
		if res.Errors > 0 {
			fmt.Fprintf(os.Stderr, "error replies: %v\n", res.ErrorSamples)
		}
		if jsonOut != nil {
			if err := bench.WriteJSONLine(jsonOut, res); err != nil {
				return err
			}
		}
	}
	return runErr
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
