package bench

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// Target is the kind of server under load: it decides the commands sent.
type Target string

// Targets.
const (
	// TargetDiskque sends ADDJOB / GETJOB NOHANG COUNT P / ACKJOB.
	TargetDiskque Target = "diskque"
	// TargetRedis sends LPUSH / RPOP (pipelined P deep): the same queue
	// shape without acknowledgements, as a yardstick.
	TargetRedis Target = "redis"
)

// Workload is what each client does.
type Workload string

// Workloads.
const (
	// WorkloadProduce adds jobs: ADDJOB q body 0, or LPUSH q body.
	WorkloadProduce Workload = "produce"
	// WorkloadConsume takes jobs from a pre-filled queue and acknowledges
	// them; a client stops when the queue is empty or the count is reached.
	WorkloadConsume Workload = "consume"
	// WorkloadMixed runs half the clients as producers and half as
	// consumers on the same queue at once.
	WorkloadMixed Workload = "mixed"
	// WorkloadDelayed fills a delayed backlog: ADDJOB q body 0 DELAY d
	// TTL t, with d drawn uniformly from [0, Horizon) seconds and t =
	// Horizon + 1 day (DELAY must be below TTL, whose default is a day).
	// diskque only.
	WorkloadDelayed Workload = "delayed"
	// WorkloadRestart is not a Run workload: RunRestart fills a server it
	// started, SIGKILLs it and measures the restart.
	WorkloadRestart Workload = "restart"
)

// ParseTarget accepts "diskque" or "redis".
func ParseTarget(s string) (Target, error) {
	switch t := Target(s); t {
	case TargetDiskque, TargetRedis:
		return t, nil
	}
	return "", fmt.Errorf("bench: unknown target %q (want diskque or redis)", s)
}

// ParseWorkload accepts "produce", "consume", "mixed", "delayed" or
// "restart" (the last one is for RunRestart, not Run).
func ParseWorkload(s string) (Workload, error) {
	switch w := Workload(s); w {
	case WorkloadProduce, WorkloadConsume, WorkloadMixed, WorkloadDelayed, WorkloadRestart:
		return w, nil
	}
	return "", fmt.Errorf("bench: unknown workload %q (want produce, consume, mixed, delayed or restart)", s)
}

// Options describes one run. Count and Duration may both be set: the run
// stops at whichever comes first; at least one must be.
type Options struct {
	// Addr is the server's host:port. Default "127.0.0.1:7711".
	Addr string
	// Target is the server kind. Default TargetDiskque.
	Target Target
	// Workload is what the clients do. Default WorkloadProduce.
	Workload Workload
	// Label names the run in tables (e.g. "diskque fsync=always").
	// Default: the target.
	Label string
	// Clients is the number of connections, one goroutine each. Default 50.
	// Mixed needs at least 2.
	Clients int
	// Pipeline is the depth P: a producer sends P commands and then reads
	// P replies; a diskque consumer asks GETJOB for COUNT P jobs and acks
	// them with one ACKJOB; a redis consumer sends P RPOPs. Default 1.
	Pipeline int
	// Body is the job body size in bytes. Default 100.
	Body int
	// Count bounds the operations of the run: jobs produced (produce),
	// jobs consumed (consume), or both together (mixed: producers add
	// ceil(Count/2), consumers take the rest). 0 = no bound.
	Count int64
	// Duration bounds the run's wall time. 0 = no bound. A batch in flight
	// at the deadline completes.
	Duration time.Duration
	// Queue is the queue (redis: list key) name. Default "bench".
	Queue string
	// Prefill, for WorkloadConsume, first adds this many jobs with a
	// produce phase (same clients and pipeline) that is not measured.
	// Default 0.
	Prefill int64
	// Timeout bounds each batch's write and read: a server that stalls
	// longer makes the run fail instead of hang. Default 60s.
	Timeout time.Duration
	// MixedPoll, for WorkloadMixed, is the TIMEOUT of the blocking GETJOB
	// (or BRPOP) a consumer sends when it finds the queue empty while the
	// producers still run. Default 100ms.
	MixedPoll time.Duration
	// Horizon, for WorkloadDelayed, is the span the delays are spread
	// over. Default 30 days; it is rounded to whole seconds.
	Horizon time.Duration
	// Progress, if not nil, receives a progress line (ops done / total,
	// rate), rewritten in place with \r about once a second, for runs
	// that last longer than two seconds. Meant for a terminal.
	Progress io.Writer
}

// DefaultOptions returns the defaults described on each field, with
// Count 100 000.
func DefaultOptions() Options {
	return Options{
		Addr:      "127.0.0.1:7711",
		Target:    TargetDiskque,
		Workload:  WorkloadProduce,
		Clients:   50,
		Pipeline:  1,
		Body:      100,
		Count:     100_000,
		Queue:     "bench",
		Timeout:   60 * time.Second,
		MixedPoll: 100 * time.Millisecond,
	}
}

// ensureDefaults fills zero fields with their defaults.
func (o *Options) ensureDefaults() {
	d := DefaultOptions()
	if o.Addr == "" {
		o.Addr = d.Addr
	}
	if o.Target == "" {
		o.Target = d.Target
	}
	if o.Workload == "" {
		o.Workload = d.Workload
	}
	if o.Label == "" {
		o.Label = string(o.Target)
	}
	if o.Clients == 0 {
		o.Clients = d.Clients
	}
	if o.Pipeline == 0 {
		o.Pipeline = d.Pipeline
	}
	if o.Body == 0 {
		o.Body = d.Body
	}
	if o.Queue == "" {
		o.Queue = d.Queue
	}
	if o.Timeout == 0 {
		o.Timeout = d.Timeout
	}
	if o.MixedPoll == 0 {
		o.MixedPoll = d.MixedPoll
	}
	if o.Horizon == 0 && o.Workload == WorkloadDelayed {
		o.Horizon = DefaultHorizon
	}
}

// DefaultHorizon is the delayed workload's default Horizon: 30 days.
const DefaultHorizon = 30 * 24 * time.Hour

// Validate reports the first inconsistent option (after defaults).
func (o *Options) Validate() error {
	if _, err := ParseTarget(string(o.Target)); err != nil {
		return err
	}
	if _, err := ParseWorkload(string(o.Workload)); err != nil {
		return err
	}
	switch {
	case o.Workload == WorkloadRestart:
		return errors.New("bench: the restart workload runs with RunRestart, not Run")
	case o.Workload == WorkloadDelayed && o.Target != TargetDiskque:
		return errors.New("bench: the delayed workload needs diskque (ADDJOB DELAY)")
	case o.Workload == WorkloadDelayed && o.Horizon < time.Second:
		return errors.New("bench: the delayed workload needs a horizon of at least 1s")
	case o.Clients < 1:
		return errors.New("bench: clients must be at least 1")
	case o.Workload == WorkloadMixed && o.Clients < 2:
		return errors.New("bench: mixed needs at least 2 clients (half produce, half consume)")
	case o.Pipeline < 1:
		return errors.New("bench: pipeline must be at least 1")
	case o.Body < 0:
		return errors.New("bench: body size must not be negative")
	case o.Count < 0 || o.Duration < 0 || o.Prefill < 0:
		return errors.New("bench: count, duration and prefill must not be negative")
	case o.Count == 0 && o.Duration == 0:
		return errors.New("bench: set a count or a duration")
	case o.Timeout < 0 || o.MixedPoll < time.Millisecond:
		return errors.New("bench: timeout must not be negative and the mixed poll must be at least 1ms")
	}
	return nil
}
