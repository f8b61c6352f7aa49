// Command diskque-bench measures a diskque (or redis) server's throughput
// and latency, or with --matrix starts servers in every persistence mode
// and compares them. The work is done by package bench.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

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
		workload  = flag.String("workload", string(d.Workload), "produce, consume or mixed")
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
		serverBin = flag.String("server", "bin/diskque-server", "--matrix: diskque-server binary")
		redisBin  = flag.String("redis", "/usr/bin/redis-server", "--matrix: redis-server binary")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if *count == 0 && *duration == 0 {
		*count = d.Count
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

	if *matrix {
		m := bench.MatrixOptions{
			ServerBin: *serverBin, RedisBin: *redisBin,
			Clients: *clients, Body: *body, Count: *count, Duration: *duration, Timeout: *timeout,
			Progress: os.Stderr,
		}
		if jsonOut != nil {
			m.JSON = jsonOut
		}
		results, err := bench.RunMatrix(ctx, m)
		if len(results) > 0 {
			fmt.Print(bench.MatrixTable(results))
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
	opts := bench.Options{
		Addr: *addr, Target: t, Workload: w, Clients: *clients, Pipeline: *pipeline, Body: *body,
		Count: *count, Duration: *duration, Queue: *queue, Timeout: *timeout, Prefill: *prefill,
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
