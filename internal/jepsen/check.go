package jepsen

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Rule names a property a history must have.
type Rule string

// The rules Check applies.
const (
	// Lost: an ADDJOB with RETRY > 0 that replied with an id was never
	// delivered (at-least-once).
	Lost Rule = "lost"
	// Duplicated: a RETRY 0 job (whatever its ADDJOB replied) was
	// delivered more than once (at-most-once).
	Duplicated Rule = "duplicated"
	// DeliveredAfterGone: a GETJOB invoked after the prober saw no node
	// hold an acked job delivered it.
	DeliveredAfterGone Rule = "delivered-after-ack-completed"
	// NotCollected: a node still holds an acked job after the drain and
	// the wait for ack GC. Acked means an ACKJOB (not FASTACK: its DELJOB
	// is best effort) that replied, on a node that knew the job (reply 1)
	// or for an at-least-once id (Disque makes a dummy ack for one it does
	// not know and searches the cluster for its holders; an ACKJOB of an
	// unknown at-most-once id does nothing).
	NotCollected Rule = "not-collected"
	// LeftoverDummy: a node still holds a dummy ack (an acked placeholder
	// without a body) of an acked job after the drain and the wait for ack
	// GC. Not a copy that can be delivered, but state ack GC should have
	// cleared (TestClusterProcessesAckToNonHolder expects every trace of
	// a job acked on a non-holder gone); left, it lasts the id's TTL.
	LeftoverDummy Rule = "leftover-dummy-ack"
	// WrongBody: a delivered job's id and body do not belong to the same
	// ADDJOB (a body no ADDJOB sent, or an id its ADDJOB did not reply).
	WrongBody Rule = "wrong-body"
)

// Violation is one broken rule for one job.
type Violation struct {
	Rule   Rule
	ID     string // the job's id, if known
	Body   string // the job's body, if known
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: job %s body %s: %s", v.Rule, orDash(v.ID), orDash(v.Body), v.Detail)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// job is what the history says about one job, keyed by body (unique per
// ADDJOB; an indeterminate ADDJOB has no id, but its body still names it).
type job struct {
	add        *Event
	ids        []string // the id the ADDJOB replied and every id it was delivered under
	deliveries []Event  // GETJOB events that delivered it (one per event)
}

// Check applies every rule to h and returns the violations, sorted by
// rule then job. A history with none is valid.
func Check(h History) []Violation {
	jobs := map[string]*job{} // by body
	for i := range h {
		e := &h[i]
		if e.Kind == Add {
			j := &job{add: e}
			if e.Outcome == OK && e.ID != "" {
				j.ids = []string{e.ID}
			}
			jobs[e.Body] = j
		}
	}
	var out []Violation
	bodyOf := map[string]string{} // delivered id → first body seen with it
	for _, e := range h {
		if e.Kind != Get {
			continue
		}
		for _, d := range e.Jobs {
			j, ok := jobs[d.Body]
			if !ok {
				out = append(out, Violation{Rule: WrongBody, ID: d.ID, Body: d.Body,
					Detail: fmt.Sprintf("delivered by %s on %s with a body no ADDJOB sent", e.Process, NodeName(e.Node))})
				continue
			}
			if b, ok := bodyOf[d.ID]; ok && b != d.Body {
				out = append(out, Violation{Rule: WrongBody, ID: d.ID, Body: d.Body,
					Detail: fmt.Sprintf("delivered with body %s, and elsewhere with body %s", d.Body, b)})
			}
			bodyOf[d.ID] = d.Body
			if j.add.Outcome == OK && j.add.ID != d.ID {
				out = append(out, Violation{Rule: WrongBody, ID: d.ID, Body: d.Body,
					Detail: fmt.Sprintf("its ADDJOB replied id %s", j.add.ID)})
			}
			if !slices.Contains(j.ids, d.ID) {
				j.ids = append(j.ids, d.ID)
			}
			if len(j.deliveries) == 0 || j.deliveries[len(j.deliveries)-1].Seq != e.Seq {
				j.deliveries = append(j.deliveries, e)
			}
		}
	}
	for body, j := range jobs {
		a := j.add
		switch {
		case a.Retry > 0 && a.Outcome == OK && len(j.deliveries) == 0:
			out = append(out, Violation{Rule: Lost, ID: a.ID, Body: body,
				Detail: fmt.Sprintf("ADDJOB RETRY %d REPLICATE %d%s on %s replied an id; never delivered",
					a.Retry, a.Replicate, asyncWord(a.Async), NodeName(a.Node))})
		case a.Retry == 0 && len(j.deliveries) > 1:
			var where []string
			for _, d := range j.deliveries {
				where = append(where, fmt.Sprintf("%s on %s at %.3fs", d.Process, NodeName(d.Node), d.End.Seconds()))
			}
			id := a.ID
			if id == "" && len(j.ids) > 0 {
				id = j.ids[0]
			}
			out = append(out, Violation{Rule: Duplicated, ID: id, Body: body,
				Detail: fmt.Sprintf("RETRY 0 (ADDJOB %s) delivered %d times: %s", a.Outcome, len(j.deliveries), strings.Join(where, "; "))})
		}
	}
	// Acked jobs: seen gone, then delivered; or held at the end.
	acked := Acked(h)
	gone := map[string]time.Duration{}
	for _, e := range h {
		switch {
		case e.Kind == Gone:
			if t, ok := gone[e.ID]; !ok || e.End < t {
				gone[e.ID] = e.End
			}
		}
	}
	holders := map[string][]string{} // acked id → nodes that still hold a copy
	dummies := map[string][]string{} // acked id → nodes that still hold a dummy ack
	for _, e := range h {
		switch e.Kind {
		case Get:
			for _, d := range e.Jobs {
				if t, ok := gone[d.ID]; ok && e.Start > t {
					out = append(out, Violation{Rule: DeliveredAfterGone, ID: d.ID, Body: d.Body,
						Detail: fmt.Sprintf("no node held it at %.3fs, yet %s's GETJOB on %s invoked at %.3fs delivered it",
							t.Seconds(), e.Process, NodeName(e.Node), e.Start.Seconds())})
				}
			}
		case Holds:
			switch {
			case acked[e.ID] && e.Dummy:
				dummies[e.ID] = append(dummies[e.ID], NodeName(e.Node))
			case acked[e.ID]:
				holders[e.ID] = append(holders[e.ID], NodeName(e.Node)+" "+e.Detail)
			}
		}
	}
	for id, hs := range holders {
		slices.Sort(hs)
		out = append(out, Violation{Rule: NotCollected, ID: id, Body: bodyOf[id],
			Detail: "after the drain and the wait for ack GC, still held by " + strings.Join(hs, ", ")})
	}
	for id, ns := range dummies {
		if holders[id] != nil {
			continue // reported as not collected
		}
		slices.Sort(ns)
		out = append(out, Violation{Rule: LeftoverDummy, ID: id, Body: bodyOf[id],
			Detail: "after the drain and the wait for ack GC, a dummy ack is left on " + strings.Join(ns, ", ")})
	}
	slices.SortFunc(out, func(a, b Violation) int {
		if c := strings.Compare(string(a.Rule), string(b.Rule)); c != 0 {
			return c
		}
		if c := strings.Compare(a.Body, b.Body); c != 0 {
			return c
		}
		return strings.Compare(a.Detail, b.Detail)
	})
	return out
}

// Acked is the ids of h's jobs that ack GC must delete from every node: an
// ACKJOB replied on a node that knew the job, or for an at-least-once id
// (see NotCollected).
func Acked(h History) map[string]bool {
	out := map[string]bool{}
	for _, e := range h {
		if e.Kind == Ack && e.Outcome == OK && e.Detail != "FASTACK" && (e.Known > 0 || AtLeastOnceID(e.ID)) {
			out[e.ID] = true
		}
	}
	return out
}

// AtLeastOnceID reports whether a job id is of an at-least-once job: the
// last hex digit of its TTL field (the id's last four) is odd (SPEC.md).
func AtLeastOnceID(id string) bool {
	if id == "" {
		return false
	}
	d := id[len(id)-1]
	var v byte
	switch {
	case d >= '0' && d <= '9':
		v = d - '0'
	case d >= 'a' && d <= 'f':
		v = d - 'a' + 10
	default:
		return false
	}
	return v&1 == 1
}

func asyncWord(async bool) string {
	if async {
		return " ASYNC"
	}
	return ""
}
