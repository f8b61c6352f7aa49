package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// fakeProcs records what the kill nemesis did and checks it never kills a
// dead node or starts a live one.
type fakeProcs struct {
	up  []bool
	log []string
}

func (f *fakeProcs) Kill(n int) error {
	if !f.up[n] {
		return fmt.Errorf("node %d already down", n)
	}
	f.up[n] = false
	f.log = append(f.log, fmt.Sprint("kill ", n))
	return nil
}

func (f *fakeProcs) Start(n int) error {
	if f.up[n] {
		return fmt.Errorf("node %d already up", n)
	}
	f.up[n] = true
	f.log = append(f.log, fmt.Sprint("start ", n))
	return nil
}

type fakeNet struct{ log []string }

func (f *fakeNet) Partition(g [][]int) error { f.log = append(f.log, FormatGroups(g)); return nil }
func (f *fakeNet) Heal() error               { f.log = append(f.log, "heal"); return nil }

func plan(seed uint64, procs Processes, net Partitioner) []Op {
	nem := []Nemesis{&KillNemesis{Procs: procs, MaxDown: 2, AllEvery: 6}, &PartitionNemesis{Net: net, N: 5}}
	return Schedule(Seeds(seed, 1)[0], NewWorld(5), nem, 60*time.Second, time.Second, 3*time.Second)
}

// The same seed gives the same schedule; another seed another one.
func TestScheduleIsAFunctionOfTheSeed(t *testing.T) {
	a, b, c := plan(7, nil, nil), plan(7, nil, nil), plan(8, nil, nil)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two schedules of seed 7 differ:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, c) {
		t.Fatalf("seeds 7 and 8 gave the same schedule %v", a)
	}
}

// Over many seeds: no more than MaxDown nodes down outside a kill of all,
// every kill of all followed by a start of all, every node up and the
// network whole at the end, ops spaced by the gaps, Healthy true exactly
// when the world is.
func TestScheduleKeepsItsBounds(t *testing.T) {
	sawAll, sawPartition := false, false
	for seed := range uint64(200) {
		ops := plan(seed, nil, nil)
		w := NewWorld(5)
		for i, op := range ops {
			switch op.Kind {
			case Kill:
				for _, n := range op.Nodes {
					if w.Down[n] {
						t.Fatalf("seed %d op %v: %s already down", seed, op, NodeName(n))
					}
					w.Down[n] = true
				}
				if op.Detail == "all" {
					sawAll = true
					if len(op.Nodes) != 5 {
						t.Fatalf("seed %d: kill of all %v", seed, op)
					}
				} else if len(w.DownNodes()) > 2 {
					t.Fatalf("seed %d op %v: %d nodes down", seed, op, len(w.DownNodes()))
				}
			case Start:
				for _, n := range op.Nodes {
					if !w.Down[n] {
						t.Fatalf("seed %d op %v: %s already up", seed, op, NodeName(n))
					}
					w.Down[n] = false
				}
			case Partition:
				sawPartition = true
				if w.Partitioned {
					t.Fatalf("seed %d op %v: already partitioned", seed, op)
				}
				w.Partitioned = true
			case Heal:
				w.Partitioned = false
			}
			if op.Healthy != w.Healthy() {
				t.Fatalf("seed %d op %v: Healthy %v, world healthy %v", seed, op, op.Healthy, w.Healthy())
			}
			if i > 0 && op.At < ops[i-1].At {
				t.Fatalf("seed %d: op %v before the previous %v", seed, op, ops[i-1])
			}
		}
		if !w.Healthy() {
			t.Fatalf("seed %d: the schedule ends unhealthy: %+v", seed, w)
		}
	}
	if !sawAll || !sawPartition {
		t.Errorf("200 seeds: a kill of all %v, a partition %v; want both", sawAll, sawPartition)
	}
}

// Execute applies each op through its nemesis, records it, and leaves the
// fault state healthy once the last op healed everything.
func TestExecuteAppliesAndRecords(t *testing.T) {
	procs := &fakeProcs{up: []bool{true, true, true, true, true}}
	net := &fakeNet{}
	nem := []Nemesis{&KillNemesis{Procs: procs, MaxDown: 2, AllEvery: 3}, &PartitionNemesis{Net: net, N: 5}}
	ops := Schedule(rand.New(rand.NewPCG(1, 2)), NewWorld(5), nem, 50*time.Millisecond, time.Millisecond, 2*time.Millisecond)
	rec, faults := NewRecorder(), NewFaults()
	if err := Execute(context.Background(), rec, faults, rec.Now(), ops, nem); err != nil {
		t.Fatal(err)
	}
	h := rec.History()
	if len(h) != len(ops) {
		t.Fatalf("%d events for %d ops", len(h), len(ops))
	}
	for i, e := range h {
		if e.Kind != ops[i].Kind || !reflect.DeepEqual(e.Nodes, ops[i].Nodes) || e.Outcome != OK {
			t.Errorf("event %d = %v for op %v", i, e, ops[i])
		}
		if e.End < ops[i].At {
			t.Errorf("op %v applied at %v, before its time", ops[i], e.End)
		}
	}
	if len(procs.log) == 0 || len(net.log) == 0 {
		t.Errorf("kills/starts %v, partitions %v: want both nemeses used", procs.log, net.log)
	}
	for n, up := range procs.up {
		if !up {
			t.Errorf("node %d down after the schedule", n)
		}
	}
	if _, healthy := faults.Snapshot(); !healthy {
		t.Errorf("the fault state is not healthy after the schedule recovered")
	}
	// A failing Apply stops the run with its error.
	procs.up[0] = false
	bad := []Op{{Nemesis: "kill", Kind: Start, Nodes: []int{1}}}
	if err := Execute(context.Background(), rec, faults, rec.Now(), bad, nem); err == nil {
		t.Errorf("Execute of a start of a live node: no error")
	}
}

func TestGroupsRoundTrip(t *testing.T) {
	g := [][]int{{0, 2}, {1, 3, 4}}
	s := FormatGroups(g)
	if s != "n1,n3|n2,n4,n5" {
		t.Errorf("FormatGroups = %q", s)
	}
	back, err := ParseGroups(s)
	if err != nil || !reflect.DeepEqual(back, g) {
		t.Errorf("ParseGroups(%q) = %v, %v", s, back, err)
	}
	if _, err := ParseGroups("n1,x|n2"); err == nil {
		t.Errorf("ParseGroups of a bad name: no error")
	}
}

// The mix: RETRY 0 adds are REPLICATE 1 and never ASYNC; the others stay
// in bounds; bodies are unique.
func TestMixStaysInBounds(t *testing.T) {
	m, rng := DefaultMix(), rand.New(rand.NewPCG(3, 4))
	bodies := map[string]bool{}
	kinds := map[string]bool{}
	for i := range 2000 {
		a := m.NextAdd(rng, "p1", i)
		if bodies[a.Body] {
			t.Fatalf("body %s twice", a.Body)
		}
		bodies[a.Body] = true
		switch {
		case a.Retry == 0 && (a.Replicate != 1 || a.Async):
			t.Fatalf("RETRY 0 add %+v", a)
		case a.Retry < 0 || a.Retry > m.MaxRetry || a.Replicate < 1 || a.Replicate > m.MaxReplicate:
			t.Fatalf("add out of bounds %+v", a)
		}
		kinds[fmt.Sprint(a.Retry == 0, a.Replicate, a.Async)] = true
	}
	for _, want := range []string{"true 1 false", "false 1 false", "false 2 false", "false 3 false", "false 2 true", "false 3 true"} {
		if !kinds[want] {
			t.Errorf("2000 adds never had (retry0, replicate, async) = %s", want)
		}
	}
}
