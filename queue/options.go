package queue

import (
	"errors"
	"log/slog"
	"time"

	"github.com/diskque/diskque/storage"
)

// Options configure a Broker. The zero value of a field means its default.
type Options struct {
	// Store holds the jobs. Required.
	Store *storage.Store
	// HeadSize is how many of each queue's oldest entries are kept in memory
	// (K in DESIGN.md). Default 1024.
	HeadSize int
	// Horizon is how far ahead the timer wheel holds schedule events; later
	// ones stay on disk until the loader reaches them. Default 10 minutes.
	Horizon time.Duration
	// MaxTimers bounds the events in the wheel (about 150 bytes each): when
	// more are due inside the horizon, the horizon shrinks. Default 200,000.
	MaxTimers int
	// Now is the clock. Default time.Now. Only the broker reads it; the data
	// structures take time as an argument.
	Now func() time.Time
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Cluster is the other nodes (package replication's Jobs). Default: a
	// lone node, which replicates nothing and deletes acked jobs at once.
	Cluster Cluster
}

// EnsureDefaults fills in every zero field with its default.
func (o *Options) EnsureDefaults() {
	if o.HeadSize == 0 {
		o.HeadSize = 1024
	}
	if o.Horizon == 0 {
		o.Horizon = 10 * time.Minute
	}
	if o.MaxTimers == 0 {
		o.MaxTimers = 200_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Cluster == nil {
		o.Cluster = loneNode{}
	}
}

// Validate reports the first invalid field.
func (o *Options) Validate() error {
	switch {
	case o.Store == nil:
		return errors.New("queue: Options.Store is required")
	case o.HeadSize < 1:
		return errors.New("queue: HeadSize must be at least 1")
	case o.Horizon < time.Second:
		return errors.New("queue: Horizon must be at least 1s")
	case o.MaxTimers < 16:
		return errors.New("queue: MaxTimers must be at least 16")
	}
	return nil
}

// Errors the broker returns; the server maps them to RESP replies.
var (
	// ErrPaused: ADDJOB or ENQUEUE on a queue paused for input.
	ErrPaused = errors.New("queue: queue paused in input")
	// ErrMaxLen: ADDJOB with MAXLEN on a queue already that long.
	ErrMaxLen = errors.New("queue: queue is already longer than MAXLEN")
	// ErrNoRepl: more replicas requested than reachable nodes.
	ErrNoRepl = errors.New("queue: not enough reachable nodes for the requested replication level")
	// ErrNoJob: the job is not known to this node.
	ErrNoJob = errors.New("queue: job not known")
	// ErrTooLate: WORKING after half the job's TTL elapsed.
	ErrTooLate = errors.New("queue: half of job TTL already elapsed")
	// ErrClosed: the broker is shutting down.
	ErrClosed = errors.New("queue: broker closed")
)
