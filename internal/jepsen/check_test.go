package jepsen

import (
	"strings"
	"testing"
	"time"
)

func s(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }

func add(start, end float64, node int, body, id string, retry int, out Outcome) Event {
	repl := 2
	if retry == 0 {
		repl = 1
	}
	return Event{Process: "p1", Node: node, Kind: Add, Outcome: out, Start: s(start), End: s(end),
		Queue: "q", Body: body, ID: id, Retry: retry, Replicate: repl}
}

func get(start, end float64, node int, jobs ...Delivered) Event {
	return Event{Process: "c1", Node: node, Kind: Get, Outcome: OK, Start: s(start), End: s(end), Queue: "q", Jobs: jobs}
}

func ack(start, end float64, node int, id string, out Outcome) Event {
	return Event{Process: "c1", Node: node, Kind: Ack, Outcome: out, Start: s(start), End: s(end), ID: id,
		Detail: "ACKJOB", Known: 1}
}

func holds(node int, id string) Event {
	return Event{Process: "final", Node: node, Kind: Holds, Outcome: OK, Start: s(9), End: s(9), ID: id, Detail: "state acked"}
}

func kill(at float64, nodes ...int) Event {
	return Event{Process: "nemesis", Node: -1, Kind: Kill, Outcome: OK, Start: s(at), End: s(at + 0.01), Nodes: nodes}
}

// history numbers the events in order, as a Recorder would.
func history(es ...Event) History {
	for i := range es {
		es[i].Seq = i
	}
	return es
}

// valid is a history that breaks no rule: each kind of job delivered as
// its rules allow, an indeterminate add never delivered, an acked job
// delivered again before (not after) it was seen gone.
func valid() History {
	return history(
		add(0, 0.1, 0, "a", "D-a", 1, OK),
		add(0, 0.1, 1, "b", "D-b", 0, OK),
		add(0, 0.2, 2, "c", "", 1, Maybe),
		add(0, 0.2, 2, "d", "", 0, Maybe),
		kill(0.15, 2),
		get(0.3, 0.4, 0, Delivered{"D-a", "a"}),
		get(0.3, 0.4, 1, Delivered{"D-b", "b"}),
		get(0.3, 0.5, 3, Delivered{"D-d", "d"}), // the indeterminate RETRY 0 add, once
		ack(0.5, 0.6, 0, "D-a", OK),
		get(0.55, 1.7, 1, Delivered{"D-a", "a"}), // again, but invoked before it was gone
		Event{Process: "prober", Node: -1, Kind: Gone, Outcome: OK, Start: s(1), End: s(1.6), ID: "D-a"},
		get(2, 2.1, 1),
	)
}

func TestCheckValidHistory(t *testing.T) {
	h := valid()
	if vs := Check(h); len(vs) != 0 {
		t.Fatalf("Check(valid history) = %v, want none\n%s", vs, h)
	}
	c := h.Count()
	if c.AddsOK != 2 || c.AddsMaybe != 2 || c.Deliveries != 4 || c.AcksOK != 1 || c.Kills != 1 || c.Gone != 1 ||
		c.Redelivered != 1 || c.NeverDelivered != 0 {
		t.Errorf("Count = %+v", c)
	}
}

// Each case adds events to the valid history that break exactly one rule.
func TestCheckFindsEachViolation(t *testing.T) {
	cases := []struct {
		name  string
		extra []Event
		rule  Rule
		body  string
	}{
		{"at-least-once add never delivered", []Event{add(1, 1.1, 4, "e", "D-e", 2, OK)}, Lost, "e"},
		{"RETRY 0 delivered twice", []Event{get(3, 3.1, 4, Delivered{"D-b", "b"})}, Duplicated, "b"},
		{"indeterminate RETRY 0 delivered twice", []Event{get(3, 3.1, 1, Delivered{"D-d", "d"})}, Duplicated, "d"},
		{"delivered after it was seen gone", []Event{get(1.65, 1.8, 2, Delivered{"D-a", "a"})}, DeliveredAfterGone, "a"},
		{"acked job held after GC", []Event{holds(3, "D-a"), holds(1, "D-a")}, NotCollected, "a"},
		{"dummy ack left after GC", []Event{func() Event { e := holds(2, "D-a"); e.Dummy = true; return e }()}, LeftoverDummy, "a"},
		{"body no ADDJOB sent", []Event{get(3, 3.1, 0, Delivered{"D-x", "x"})}, WrongBody, "x"},
		{"body under another id", []Event{get(3, 3.1, 0, Delivered{"D-z", "a"})}, WrongBody, "a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := history(append(valid(), tc.extra...)...)
			vs := Check(h)
			if len(vs) != 1 || vs[0].Rule != tc.rule || vs[0].Body != tc.body {
				t.Fatalf("Check = %v, want one %s violation of job %s\n%s", vs, tc.rule, tc.body, h)
			}
			// The shrunk history still breaks the rule, keeps only
			// that job's events plus nemesis context, and is no longer
			// than the original.
			min := Shrink(h, vs[0])
			if !breaks(min, vs[0]) {
				t.Errorf("Shrink's history no longer breaks %v:\n%s", vs[0], min)
			}
			for _, e := range min {
				if !e.Nemesis() && !e.mentions(vs[0].ID, vs[0].Body) {
					t.Errorf("Shrink kept an event of another job: %v", e)
				}
			}
			if len(min) >= len(h) {
				t.Errorf("Shrink kept %d of %d events", len(min), len(h))
			}
			r := Report(42, h, vs, 5)
			for _, want := range []string{"seed 42", string(tc.rule), "-jepsen.seed=42", "adds ok"} {
				if !strings.Contains(r, want) {
					t.Errorf("Report lacks %q:\n%s", want, r)
				}
			}
		})
	}
}

// Only an ACKJOB that took effect makes a job acked for NotCollected: not
// a FASTACK (best effort), not an ACKJOB of an at-most-once id a node did
// not know (Disque does nothing then), not one without a reply.
func TestNotCollectedOnlyForAcksThatTookEffect(t *testing.T) {
	unknownAck := ack(1, 1.1, 3, "D-b0", OK)
	unknownAck.Known = 0
	fast := ack(1, 1.1, 3, "D-c0", OK)
	fast.Detail = "FASTACK"
	dummy := ack(1, 1.1, 3, "D-d1", OK) // at-least-once id unknown there: a dummy ack
	dummy.Known = 0
	h := history(unknownAck, fast, ack(1, 1.2, 2, "D-e1", Maybe), dummy,
		holds(0, "D-b0"), holds(0, "D-c0"), holds(0, "D-e1"), holds(0, "D-d1"))
	vs := Check(h)
	if len(vs) != 1 || vs[0].Rule != NotCollected || vs[0].ID != "D-d1" {
		t.Fatalf("Check = %v, want one not-collected, of D-d1", vs)
	}
	if !strings.Contains(vs[0].Detail, "n1 state acked") {
		t.Errorf("the violation does not name the holder: %v", vs[0])
	}
}

func TestAtLeastOnceID(t *testing.T) {
	for id, want := range map[string]bool{"D-12345678-ABCDEFGHIJKLMNOPQRSTUVWX-05a1": true,
		"D-12345678-ABCDEFGHIJKLMNOPQRSTUVWX-05a0": false, "D-x-000f": true, "D-x-000e": false, "": false, "D-x-000Z": false} {
		if got := AtLeastOnceID(id); got != want {
			t.Errorf("AtLeastOnceID(%q) = %v", id, got)
		}
	}
}

// Shrink drops what the violation does not need: a Duplicated job's acks
// and its third delivery go, its add and two deliveries stay, and the kill near them is kept as
// context while one long before is not.
func TestShrinkKeepsTheViolationAndNearbyFaults(t *testing.T) {
	h := history(
		kill(0, 4), // long before: not context
		add(20, 20.1, 0, "b", "D-b", 0, OK),
		get(20.2, 20.3, 0, Delivered{"D-b", "b"}),
		ack(20.3, 20.4, 0, "D-b", OK),
		kill(21, 0),
		get(23, 23.1, 1, Delivered{"D-b", "b"}),
		ack(23.1, 23.2, 1, "D-b", OK),
		get(24, 24.1, 2, Delivered{"D-b", "b"}),
	)
	vs := Check(h)
	if len(vs) != 1 || vs[0].Rule != Duplicated {
		t.Fatalf("Check = %v, want one duplicated", vs)
	}
	min := Shrink(h, vs[0])
	kinds := map[Kind]int{}
	for _, e := range min {
		kinds[e.Kind]++
	}
	if kinds[Add] != 1 || kinds[Get] != 2 || kinds[Ack] != 0 || kinds[Kill] != 1 {
		t.Errorf("Shrink kept %v, want the add, two deliveries and the kill near them:\n%s", kinds, min)
	}
	for _, e := range min {
		if e.Kind == Kill && e.Nodes[0] != 0 {
			t.Errorf("Shrink kept the kill at 0 s, 20 s before the job: %v", e)
		}
	}
}
