package jepsen

import (
	"fmt"
	"math/rand/v2"
)

// AddSpec is one ADDJOB to send.
type AddSpec struct {
	Queue     string
	Body      string // unique: the producer and its sequence number
	Retry     int    // seconds; 0 = at most once (REPLICATE 1)
	Replicate int
	Async     bool
}

// Args is the ADDJOB command for s with timeout ms.
func (s AddSpec) Args(timeoutMS int) []any {
	args := []any{"ADDJOB", s.Queue, s.Body, timeoutMS, "REPLICATE", s.Replicate, "RETRY", s.Retry}
	if s.Async {
		args = append(args, "ASYNC")
	}
	return args
}

// Mix is the operation mix: which ADDJOBs producers send and how
// consumers treat what they get. Its zero value is not useful; see
// DefaultMix.
type Mix struct {
	Queues []string
	// AtMostOnce is the share of adds with RETRY 0 (and REPLICATE 1, which
	// Disque requires with it).
	AtMostOnce float64
	// MaxRetry bounds RETRY (seconds) of the others, drawn from 1..MaxRetry.
	MaxRetry int
	// MaxReplicate bounds REPLICATE, drawn from 1..MaxReplicate.
	MaxReplicate int
	// Async is the share of at-least-once adds with ASYNC.
	Async float64
	// SkipAck is the share of deliveries a consumer does not acknowledge
	// (as if it died), so the job is requeued after RETRY.
	SkipAck float64
	// FastAck is the share of acknowledgements sent as FASTACK.
	FastAck float64
}

// DefaultMix mixes every kind of add the checker covers.
func DefaultMix() Mix {
	return Mix{Queues: []string{"jq0", "jq1", "jq2"}, AtMostOnce: 0.2, MaxRetry: 3, MaxReplicate: 3,
		Async: 0.25, SkipAck: 0.1, FastAck: 0.15}
}

// NextAdd is producer's seq-th add.
func (m Mix) NextAdd(rng *rand.Rand, producer string, seq int) AddSpec {
	s := AddSpec{Queue: m.Queues[rng.IntN(len(m.Queues))], Body: fmt.Sprintf("%s-%d", producer, seq)}
	if rng.Float64() < m.AtMostOnce {
		s.Retry, s.Replicate = 0, 1
		return s
	}
	s.Retry = 1 + rng.IntN(m.MaxRetry)
	s.Replicate = 1 + rng.IntN(m.MaxReplicate)
	s.Async = s.Replicate > 1 && rng.Float64() < m.Async
	return s
}

// Seeds derives n independent sources from one seed: the schedule's
// (index 0) and one per worker, so a seed fixes every random choice.
func Seeds(seed uint64, n int) []*rand.Rand {
	root := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]*rand.Rand, n)
	for i := range out {
		out[i] = rand.New(rand.NewPCG(root.Uint64(), root.Uint64()))
	}
	return out
}
