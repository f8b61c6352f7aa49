package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RestartOptions configures RunRestart.
type RestartOptions struct {
	// ServerBin is the diskque-server binary. Default "bin/diskque-server".
	ServerBin string
	// Args are the server's flags after --port, --bind and --dir (e.g.
	// "--appendfsync", "everysec"). Default none (the server's defaults).
	Args []string
	// Fill is how the jobs are added: WorkloadProduce (ready jobs) or
	// WorkloadDelayed (jobs spread over Horizon). Default WorkloadProduce.
	Fill Workload
	// Count is the number of jobs to add. Required.
	Count int64
	// Clients, Pipeline, Body, Horizon and Timeout are as in Options for
	// the fill (defaults 50, 16, 100, 30 days, 60s).
	Clients  int
	Pipeline int
	Body     int
	Horizon  time.Duration
	Timeout  time.Duration
	// Queue is the queue filled. Default "restart".
	Queue string
	// ReadyTimeout bounds the first start and the restart. Default 5m.
	ReadyTimeout time.Duration
	// Progress, if not nil, receives a line per step; FillProgress is the
	// fill's Options.Progress.
	Progress     io.Writer
	FillProgress io.Writer
}

// RestartResult is what RunRestart measured.
type RestartResult struct {
	// Fill is the fill run's Result.
	Fill *Result
	// Jobs is QLEN before the kill (ready jobs; 0 for a delayed fill on
	// diskque, whose QLEN counts queued jobs only).
	Jobs int64
	// RSSBytes is the server's VmRSS just before the kill (-1 where
	// /proc/<pid>/status is not available).
	RSSBytes int64
	// DataBytes is the size of the data directory after the kill.
	DataBytes int64
	// Ready is the time from the restart's exec to PING answering and
	// INFO saying loading:0.
	Ready time.Duration
	// FirstJob is the time from the restart's exec to the first GETJOB
	// NOHANG that returned a job (produce fills), or to a successful
	// QLEN after Ready (delayed fills, where no job is due).
	FirstJob time.Duration
	// After is QLEN after the restart, before anything was taken.
	After int64
}

func (o *RestartOptions) ensureDefaults() {
	if o.ServerBin == "" {
		o.ServerBin = "bin/diskque-server"
	}
	if o.Fill == "" {
		o.Fill = WorkloadProduce
	}
	if o.Clients == 0 {
		o.Clients = 50
	}
	if o.Pipeline == 0 {
		o.Pipeline = 16
	}
	if o.Queue == "" {
		o.Queue = "restart"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 5 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// RunRestart starts ServerBin on a temporary directory, fills it with
// Count jobs, reads its RSS, SIGKILLs it, starts it again on the same
// directory and measures the time from that exec until it serves: the
// first GETJOB NOHANG returning a job for a produce fill, INFO loading:0
// and a QLEN for a delayed fill. The second server is stopped with
// SIGTERM and the directory removed before RunRestart returns.
func RunRestart(ctx context.Context, o RestartOptions) (res *RestartResult, err error) {
	o.ensureDefaults()
	if o.Fill != WorkloadProduce && o.Fill != WorkloadDelayed {
		return nil, fmt.Errorf("bench: restart: fill with produce or delayed, not %q", o.Fill)
	}
	if o.Count <= 0 {
		return nil, errors.New("bench: restart: set a count of jobs to fill")
	}
	sc, err := startScratch(ctx, "diskque-restart-", o.ServerBin, o.Args, o.ReadyTimeout, o.Progress)
	if err != nil {
		return nil, err
	}
	defer sc.close(&err)
	srv := sc.srv

	res = &RestartResult{RSSBytes: -1}
	fill := Options{
		Addr: srv.Addr, Target: TargetDiskque, Workload: o.Fill, Label: "restart fill",
		Clients: o.Clients, Pipeline: o.Pipeline, Body: o.Body, Count: o.Count,
		Queue: o.Queue, Timeout: o.Timeout, Horizon: o.Horizon, Progress: o.FillProgress,
	}
	res.Fill, err = Run(ctx, fill)
	if err != nil {
		return res, fmt.Errorf("bench: restart: fill: %w", err)
	}
	if res.Fill.Errors > 0 {
		return res, fmt.Errorf("bench: restart: fill: %d error replies, first: %s", res.Fill.Errors, res.Fill.firstError())
	}
	fmt.Fprintf(o.Progress, "filled %d %s jobs in %.2fs (%.0f/s)\n", res.Fill.Produced, o.Fill, res.Fill.Elapsed.Seconds(), res.Fill.OpsPerSec())
	if res.Jobs, err = QueueLen(srv.Addr, TargetDiskque, o.Queue); err != nil {
		return res, err
	}
	if res.RSSBytes, res.DataBytes, err = sc.kill(); err != nil {
		return res, err
	}
	fmt.Fprintf(o.Progress, "killed (SIGKILL) with RSS %.1f MB, QLEN %d; data dir %.1f MB; restarting\n",
		float64(res.RSSBytes)/1e6, res.Jobs, float64(res.DataBytes)/1e6)
	srv2, err := sc.restart()
	if err != nil {
		return res, err
	}
	if err := srv2.waitServing(ctx, o, res); err != nil {
		return res, fmt.Errorf("bench: restart: %w; its output ends:\n%s", err, srv2.Output())
	}
	fmt.Fprintf(o.Progress, "restarted: ready after %v, serving after %v, QLEN %d\n",
		res.Ready.Round(time.Millisecond), res.FirstJob.Round(time.Millisecond), res.After)
	return res, nil
}

// waitServing polls the restarted server every millisecond and fills in
// res.Ready, res.FirstJob and res.After.
func (s *Server) waitServing(ctx context.Context, o RestartOptions, res *RestartResult) error {
	deadline := s.Started.Add(o.ReadyTimeout)
	var last error
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.exited:
			return fmt.Errorf("%w: %v", ErrServerExited, s.cmd.ProcessState)
		default:
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("not serving after %v: %v", o.ReadyTimeout, last)
		}
		if res.Ready == 0 {
			if last = probeReady(s.Addr, TargetDiskque); last == nil {
				res.Ready = time.Since(s.Started)
				n, err := QueueLen(s.Addr, TargetDiskque, o.Queue)
				if err != nil {
					return err
				}
				res.After = n
				if o.Fill == WorkloadDelayed {
					res.FirstJob = time.Since(s.Started)
					return nil
				}
			}
		}
		if o.Fill == WorkloadProduce {
			// Also before Ready: a server may serve while still loading.
			replies, err := Do(s.Addr, 2*time.Second, []string{"GETJOB", "NOHANG", "FROM", o.Queue})
			switch {
			case err != nil:
				last = err
			case replies[0].Kind == KindArray && len(replies[0].Array) > 0:
				res.FirstJob = time.Since(s.Started)
				if res.Ready == 0 {
					res.Ready = res.FirstJob
					if n, err := QueueLen(s.Addr, TargetDiskque, o.Queue); err == nil {
						res.After = n + 1
					}
				}
				return nil
			default:
				last = fmt.Errorf("GETJOB: %v", replies[0])
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// processRSS reads VmRSS from /proc/<pid>/status, in bytes.
func processRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return -1, err
				}
				return kb << 10, nil
			}
		}
	}
	return -1, errors.New("bench: no VmRSS in /proc/" + strconv.Itoa(pid) + "/status")
}

// dirSize sums the sizes of the regular files under dir.
// scratch is a diskque-server the bench started on a temporary directory,
// to kill and restart it there.
type scratch struct {
	cfg ServerConfig
	srv *Server // running; nil once killed
	// again is the server restarted on the same directory, if any.
	again *Server
}

// startScratch starts the server binary serverBin on a new temporary
// directory (prefix names it) and waits until it is ready. close removes
// everything.
func startScratch(ctx context.Context, prefix, serverBin string, args []string, ready time.Duration, progress io.Writer) (*scratch, error) {
	bin, err := resolveBin(serverBin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	sc := &scratch{cfg: ServerConfig{Target: TargetDiskque, Bin: bin, Dir: dir, Args: args, ReadyTimeout: ready}}
	fmt.Fprintf(progress, "starting %s %q (dir %s)\n", bin, args, dir)
	if sc.srv, err = StartServer(ctx, sc.cfg); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return sc, nil
}

// kill reads the server's RSS (-1 where /proc is not available), SIGKILLs
// it and returns the RSS and the data directory's size after the kill.
func (sc *scratch) kill() (rss, dataBytes int64, err error) {
	rss = -1
	if n, err := processRSS(sc.srv.Pid()); err == nil {
		rss = n
	}
	srv := sc.srv
	sc.srv = nil
	if err := srv.Kill(); err != nil {
		return rss, 0, err
	}
	return rss, dirSize(sc.cfg.Dir), nil
}

// restart starts the server again on the same directory, on a new port,
// without waiting for it: the caller measures that.
func (sc *scratch) restart() (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	sc.again, err = spawn(sc.cfg, port)
	return sc.again, err
}

// close stops what still runs (SIGKILL for the first server, SIGTERM for a
// restarted one) and removes the directory, joining any failure into *err.
func (sc *scratch) close(err *error) {
	if sc.srv != nil {
		_ = sc.srv.Kill()
	}
	if sc.again != nil {
		if stopErr := sc.again.Stop(); stopErr != nil {
			*err = errors.Join(*err, stopErr)
		}
	}
	if rmErr := os.RemoveAll(sc.cfg.Dir); rmErr != nil && *err == nil {
		*err = rmErr
	}
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// RestartTable formats r as a markdown table.
func RestartTable(o RestartOptions, r *RestartResult) string {
	o.ensureDefaults()
	var b strings.Builder
	b.WriteString("| measure | value |\n|---|--:|\n")
	if r.Fill != nil {
		fmt.Fprintf(&b, "| fill: %s jobs (clients %d, pipeline %d, body %d) | %d in %.2fs = %.0f/s, p99 %s ms |\n",
			o.Fill, r.Fill.Clients, r.Fill.Pipeline, r.Fill.Body, r.Fill.Produced, r.Fill.Elapsed.Seconds(),
			r.Fill.OpsPerSec(), fmtMs(r.Fill.Latency.Quantile(0.99)))
	}
	fmt.Fprintf(&b, "| QLEN before the kill | %d |\n", r.Jobs)
	fmt.Fprintf(&b, "| server RSS before the kill (VmRSS) | %.1f MB |\n", float64(r.RSSBytes)/1e6)
	fmt.Fprintf(&b, "| data directory after the kill | %.1f MB |\n", float64(r.DataBytes)/1e6)
	fmt.Fprintf(&b, "| exec to ready (PING, INFO loading:0) | %s ms |\n", fmtMs(r.Ready))
	what := "exec to first GETJOB NOHANG returning a job"
	if o.Fill == WorkloadDelayed {
		what = "exec to ready and a QLEN answered (no job due)"
	}
	fmt.Fprintf(&b, "| %s | %s ms |\n", what, fmtMs(r.FirstJob))
	fmt.Fprintf(&b, "| QLEN after the restart | %d |\n", r.After)
	return b.String()
}
