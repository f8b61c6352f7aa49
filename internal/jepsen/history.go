package jepsen

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kind is what an event did.
type Kind string

// The kinds of events of a history.
const (
	// Add is one ADDJOB: Body (unique per add), Queue, Retry, Replicate,
	// Async; ID when it succeeded.
	Add Kind = "add"
	// Get is one GETJOB: Jobs is what it delivered (empty for a null
	// reply or a failure).
	Get Kind = "get"
	// Ack is one ACKJOB of ID.
	Ack Kind = "ack"
	// Gone is the prober's observation that no node holds ID any more, with
	// every node up for the whole observation: from End on, ID must never
	// be delivered again.
	Gone Kind = "gone"
	// Holds is the final scan's observation that Node still holds ID (the
	// acked job's copy GC did not delete); Dummy when what it holds is a
	// bodiless acked placeholder (a dummy ack), not a copy.
	Holds Kind = "holds"
	// Kill, Start, Partition and Heal are nemesis events: Nodes lists
	// the nodes, Detail the rest (partition groups).
	Kill      Kind = "kill"
	Start     Kind = "start"
	Partition Kind = "partition"
	Heal      Kind = "heal"
)

// Outcome is how an operation ended, Jepsen's three: it happened, it did
// not, or nobody knows (the node died under the call, the reply was lost).
type Outcome string

// The outcomes.
const (
	OK    Outcome = "ok"
	Fail  Outcome = "fail" // a definite error reply: nothing happened
	Maybe Outcome = "info" // no reply: it may or may not have happened
)

// Delivered is one job of a GETJOB reply.
type Delivered struct{ ID, Body string }

// Event is one operation of a history, from its invocation (Start) to its
// completion (End), both measured from the history's origin.
type Event struct {
	Seq        int           // order of completion in the history
	Process    string        // who did it: "p3" producer, "c1" consumer, "nemesis", "prober", "final"
	Node       int           // the node it went to (-1 for several)
	Kind       Kind          //
	Outcome    Outcome       //
	Start, End time.Duration // invocation and completion, since the origin
	// Add
	Queue     string
	Body      string
	Retry     int
	Replicate int
	Async     bool
	// Add (the reply), Ack, Gone, Holds
	ID string
	// Ack: the reply, how many of its ids the node knew and had not acked
	Known int64
	// Holds: a dummy ack rather than a copy of the job
	Dummy bool
	// Get
	Jobs []Delivered
	// Nemesis events
	Nodes  []int
	Detail string
	// Err is the error of a Fail or Maybe outcome.
	Err string
}

// Nemesis reports whether e is a fault or a heal rather than a client
// operation.
func (e Event) Nemesis() bool {
	switch e.Kind {
	case Kill, Start, Partition, Heal:
		return true
	}
	return false
}

// mentions reports whether e concerns the job with id or body.
func (e Event) mentions(id, body string) bool {
	if id != "" && e.ID == id {
		return true
	}
	if body != "" && e.Body == body {
		return true
	}
	for _, d := range e.Jobs {
		if (id != "" && d.ID == id) || (body != "" && d.Body == body) {
			return true
		}
	}
	return false
}

// String is one line: times in ms, the node by name.
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%8.3fs..%8.3fs %-7s", e.Start.Seconds(), e.End.Seconds(), e.Process)
	if e.Node >= 0 {
		fmt.Fprintf(&b, " %-3s", NodeName(e.Node))
	} else {
		b.WriteString("    ")
	}
	fmt.Fprintf(&b, " %-9s %-4s", e.Kind, e.Outcome)
	switch e.Kind {
	case Add:
		fmt.Fprintf(&b, " queue=%s body=%s retry=%d repl=%d", e.Queue, e.Body, e.Retry, e.Replicate)
		if e.Async {
			b.WriteString(" async")
		}
		if e.ID != "" {
			fmt.Fprintf(&b, " -> %s", e.ID)
		}
	case Get:
		fmt.Fprintf(&b, " queue=%s", e.Queue)
		for _, d := range e.Jobs {
			fmt.Fprintf(&b, " [%s %s]", d.ID, d.Body)
		}
	case Ack:
		fmt.Fprintf(&b, " %s %s", e.Detail, e.ID)
		if e.Outcome == OK {
			fmt.Fprintf(&b, " -> %d", e.Known)
		}
	case Gone, Holds:
		fmt.Fprintf(&b, " %s", e.ID)
		if e.Dummy {
			b.WriteString(" dummy-ack")
		}
		if e.Detail != "" {
			fmt.Fprintf(&b, " %s", e.Detail)
		}
	default:
		names := make([]string, len(e.Nodes))
		for i, n := range e.Nodes {
			names[i] = NodeName(n)
		}
		fmt.Fprintf(&b, " %s", strings.Join(names, ","))
		if e.Detail != "" {
			fmt.Fprintf(&b, " %s", e.Detail)
		}
	}
	if e.Err != "" {
		fmt.Fprintf(&b, " err=%q", e.Err)
	}
	return b.String()
}

// NodeName is node i's name in a history: n1, n2, …
func NodeName(i int) string { return fmt.Sprintf("n%d", i+1) }

// Recorder collects a history from many goroutines; safe for concurrent
// use. Its clock starts at NewRecorder.
type Recorder struct {
	origin time.Time
	mu     sync.Mutex
	events []Event
}

// NewRecorder starts a history now.
func NewRecorder() *Recorder { return &Recorder{origin: time.Now()} }

// Now is the time since the origin, to stamp an invocation.
func (r *Recorder) Now() time.Duration { return time.Since(r.origin) }

// Record appends e, stamping its End (when unset) and Seq.
func (r *Recorder) Record(e Event) {
	if e.End == 0 {
		e.End = r.Now()
	}
	r.mu.Lock()
	e.Seq = len(r.events)
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// History is a copy of what was recorded so far.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// History is a list of events in completion order.
type History []Event

// Counts is a history's summary.
type Counts struct {
	AddsOK, AddsFailed, AddsMaybe int
	Gets, Deliveries              int // GETJOB calls that delivered, jobs delivered
	AcksOK, AcksMaybe             int
	Gone                          int
	Kills, Starts                 int // nodes killed, nodes started (a kill of two counts two)
	Partitions, Heals             int
	// Redelivered: at-least-once jobs delivered more than once (requeued);
	// NeverDelivered: at-most-once adds that replied an id and were never
	// delivered (allowed: say, lost with a GETJOB reply to a killed node).
	Redelivered, NeverDelivered int
}

// Count summarises h.
func (h History) Count() Counts {
	var c Counts
	deliveries := map[string]int{} // by body
	for _, e := range h {
		for _, d := range e.Jobs {
			deliveries[d.Body]++
		}
	}
	for _, e := range h {
		if e.Kind == Add && e.Outcome == OK {
			switch n := deliveries[e.Body]; {
			case e.Retry > 0 && n > 1:
				c.Redelivered++
			case e.Retry == 0 && n == 0:
				c.NeverDelivered++
			}
		}
		switch e.Kind {
		case Add:
			switch e.Outcome {
			case OK:
				c.AddsOK++
			case Fail:
				c.AddsFailed++
			default:
				c.AddsMaybe++
			}
		case Get:
			if len(e.Jobs) > 0 {
				c.Gets++
				c.Deliveries += len(e.Jobs)
			}
		case Ack:
			switch e.Outcome {
			case OK:
				c.AcksOK++
			case Maybe:
				c.AcksMaybe++
			}
		case Gone:
			c.Gone++
		case Kill:
			c.Kills += len(e.Nodes)
		case Start:
			c.Starts += len(e.Nodes)
		case Partition:
			c.Partitions++
		case Heal:
			c.Heals++
		}
	}
	return c
}

func (c Counts) String() string {
	return fmt.Sprintf("adds ok %d, failed %d, indeterminate %d; deliveries %d in %d GETJOBs (at-least-once redelivered %d, "+
		"at-most-once never delivered %d); acks ok %d, indeterminate %d; observed gone %d; kills %d, restarts %d; partitions %d, heals %d",
		c.AddsOK, c.AddsFailed, c.AddsMaybe, c.Deliveries, c.Gets, c.Redelivered, c.NeverDelivered, c.AcksOK, c.AcksMaybe, c.Gone,
		c.Kills, c.Starts, c.Partitions, c.Heals)
}

// Sorted is h ordered by invocation time (then completion), the order to
// read a history in.
func (h History) Sorted() History {
	out := slices.Clone(h)
	slices.SortStableFunc(out, func(a, b Event) int {
		if c := cmp.Compare(a.Start, b.Start); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	return out
}

// String is the history, one event a line, in invocation order.
func (h History) String() string {
	var b strings.Builder
	for _, e := range h.Sorted() {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}
