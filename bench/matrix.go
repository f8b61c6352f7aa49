package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Mode is one server configuration of the matrix.
type Mode struct {
	// Name labels the mode's rows ("diskque fsync=always").
	Name string
	// Target is the server kind; it picks the binary and the commands.
	Target Target
	// Args are the server's flags after --port, --bind and --dir.
	Args []string
}

// DefaultModes are diskque in memory (appendonly no), diskque on disk with
// each fsync policy, and redis without persistence.
func DefaultModes() []Mode {
	return []Mode{
		{Name: "diskque appendonly=no", Target: TargetDiskque, Args: []string{"--appendonly", "no"}},
		{Name: "diskque fsync=no", Target: TargetDiskque, Args: []string{"--appendonly", "yes", "--appendfsync", "no"}},
		{Name: "diskque fsync=everysec", Target: TargetDiskque, Args: []string{"--appendonly", "yes", "--appendfsync", "everysec"}},
		{Name: "diskque fsync=always", Target: TargetDiskque, Args: []string{"--appendonly", "yes", "--appendfsync", "always"}},
		{Name: "redis (no persistence)", Target: TargetRedis, Args: []string{"--save", "", "--appendonly", "no"}},
	}
}

// MatrixOptions configures RunMatrix.
type MatrixOptions struct {
	// ServerBin is the diskque-server binary. Default "bin/diskque-server".
	ServerBin string
	// RedisBin is the redis-server binary. Default "/usr/bin/redis-server".
	RedisBin string
	// Modes are the servers to compare, one after the other. Default
	// DefaultModes().
	Modes []Mode
	// Pipelines are the pipeline depths to run. Default {1, 16}.
	Pipelines []int
	// Workloads run in this order for each pipeline depth, on the queue
	// "bench-p<depth>", so produce fills what consume then drains.
	// Default {produce, consume}.
	Workloads []Workload
	// Clients, Body, Count, Duration and Timeout are as in Options
	// (defaults 50, 100, 100 000 when Duration is 0 too, none, 60s).
	Clients  int
	Body     int
	Count    int64
	Duration time.Duration
	Timeout  time.Duration
	// ReadyTimeout bounds each server's start. Default 30s.
	ReadyTimeout time.Duration
	// Progress, if not nil, receives a line per step as the matrix runs
	// and each server's warning lines.
	Progress io.Writer
	// JSON, if not nil, receives each Result as a line of JSON.
	JSON io.Writer
	// LiveProgress is each run's Options.Progress (a terminal).
	LiveProgress io.Writer
}

// ModeKeys are the short names of DefaultModes, in order, for flags.
var ModeKeys = []string{"appendonly-no", "fsync-no", "everysec", "always", "redis"}

// ModesByKey returns the DefaultModes named by keys (see ModeKeys).
func ModesByKey(keys []string) ([]Mode, error) {
	all := DefaultModes()
	var out []Mode
	for _, k := range keys {
		i := slices.Index(ModeKeys, k)
		if i < 0 {
			return nil, fmt.Errorf("bench: unknown mode %q (want some of %s)", k, strings.Join(ModeKeys, ","))
		}
		out = append(out, all[i])
	}
	return out, nil
}

func (m *MatrixOptions) ensureDefaults() {
	if m.ServerBin == "" {
		m.ServerBin = "bin/diskque-server"
	}
	if m.RedisBin == "" {
		m.RedisBin = "/usr/bin/redis-server"
	}
	if len(m.Modes) == 0 {
		m.Modes = DefaultModes()
	}
	if len(m.Pipelines) == 0 {
		m.Pipelines = []int{1, 16}
	}
	if len(m.Workloads) == 0 {
		m.Workloads = []Workload{WorkloadProduce, WorkloadConsume}
	}
	if m.Count == 0 && m.Duration == 0 {
		m.Count = DefaultOptions().Count
	}
	if m.Progress == nil {
		m.Progress = io.Discard
	}
}

// RunMatrix starts each mode's server in its own temporary directory on a
// free loopback port, runs every pipeline × workload against it, stops it
// (SIGTERM, wait) and removes the directory, then goes on to the next
// mode. A failing mode is recorded (Result.Err, and in the returned error)
// and the matrix continues with the next one; ctx ending stops it. Every
// server started is stopped before RunMatrix returns.
func RunMatrix(ctx context.Context, m MatrixOptions) ([]*Result, error) {
	m.ensureDefaults()
	// A missing binary fails the matrix before any server starts.
	for _, mode := range m.Modes {
		bin := m.ServerBin
		if mode.Target == TargetRedis {
			bin = m.RedisBin
		}
		if _, err := resolveBin(bin); err != nil {
			return nil, fmt.Errorf("%s: %w", mode.Name, err)
		}
	}
	var results []*Result
	var errs []error
	for _, mode := range m.Modes {
		res, err := runMode(ctx, m, mode)
		results = append(results, res...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", mode.Name, err))
			fmt.Fprintf(m.Progress, "%s: %v\n", mode.Name, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return results, errors.Join(errs...)
}

// runMode runs one server's share of the matrix.
func runMode(ctx context.Context, m MatrixOptions, mode Mode) (results []*Result, err error) {
	bin := m.ServerBin
	if mode.Target == TargetRedis {
		bin = m.RedisBin
	}
	dir, err := os.MkdirTemp("", "diskque-bench-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if rmErr := os.RemoveAll(dir); rmErr != nil && err == nil {
			err = rmErr
		}
	}()
	fmt.Fprintf(m.Progress, "starting %s: %s %q (dir %s)\n", mode.Name, bin, mode.Args, dir)
	srv, err := StartServer(ctx, ServerConfig{
		Target: mode.Target, Bin: bin, Dir: dir, Args: mode.Args, ReadyTimeout: m.ReadyTimeout,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		stopErr := srv.Stop()
		if lines, n := srv.Notable(); n > 0 {
			fmt.Fprintf(m.Progress, "%s: %d warning/error lines in the server log, first %d:\n", mode.Name, n, len(lines))
			for _, l := range lines {
				fmt.Fprintf(m.Progress, "    %s\n", l)
			}
		}
		err = errors.Join(err, stopErr)
	}()

	for _, p := range m.Pipelines {
		queue := "bench-p" + strconv.Itoa(p)
		for _, w := range m.Workloads {
			opts := Options{
				Addr: srv.Addr, Target: mode.Target, Workload: w, Label: mode.Name,
				Clients: m.Clients, Pipeline: p, Body: m.Body, Count: m.Count, Duration: m.Duration,
				Queue: queue, Timeout: m.Timeout, Progress: m.LiveProgress,
			}
			res, runErr := Run(ctx, opts)
			if res == nil {
				return results, runErr
			}
			if left, qerr := QueueLen(srv.Addr, mode.Target, queue); qerr == nil {
				res.QueueLeft = left
			}
			if runErr != nil {
				res.Err = runErr.Error()
			}
			results = append(results, res)
			fmt.Fprintf(m.Progress, "%s %s pipeline=%d: %d ops in %.2fs = %.0f ops/s, p50 %sms p99 %sms p99.9 %sms max %sms, errors %d, queue left %d, load %s\n",
				mode.Name, w, p, res.Ops, res.Elapsed.Seconds(), res.OpsPerSec(),
				fmtMs(res.Latency.Quantile(0.5)), fmtMs(res.Latency.Quantile(0.99)),
				fmtMs(res.Latency.Quantile(0.999)), fmtMs(res.Latency.Max()), res.Errors, res.QueueLeft, res.LoadAvg)
			if res.Errors > 0 {
				fmt.Fprintf(m.Progress, "    error replies: %v\n", res.ErrorSamples)
			}
			if m.JSON != nil {
				if err := WriteJSONLine(m.JSON, res); err != nil {
					return results, err
				}
			}
			if runErr != nil {
				return results, runErr
			}
		}
	}
	return results, nil
}
