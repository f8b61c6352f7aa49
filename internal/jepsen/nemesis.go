package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// World is the cluster's fault state as a schedule is planned: which nodes
// are down and whether the network is partitioned. Nemeses read it to pick
// a fault that fits and update it with the fault they picked.
type World struct {
	Down        []bool // by node
	Partitioned bool
}

// NewWorld is n nodes, all up, the network whole.
func NewWorld(n int) *World { return &World{Down: make([]bool, n)} }

// Healthy reports whether every node is up and the network whole.
func (w *World) Healthy() bool { return !w.Partitioned && !slices.Contains(w.Down, true) }

// Up lists the nodes up; DownNodes the nodes down.
func (w *World) Up() []int        { return w.nodes(false) }
func (w *World) DownNodes() []int { return w.nodes(true) }

func (w *World) nodes(down bool) []int {
	var out []int
	for i, d := range w.Down {
		if d == down {
			out = append(out, i)
		}
	}
	return out
}

// Op is one step of a nemesis schedule.
type Op struct {
	At      time.Duration // from the start of the fault phase
	Nemesis string        // the Name of the nemesis that applies it
	Kind    Kind          // Kill, Start, Partition, Heal
	Nodes   []int         // the nodes it acts on
	Detail  string        // e.g. the partition's groups
	// Healthy is World.Healthy once this op is applied: the prober trusts
	// only observations made while it holds.
	Healthy bool
}

func (o Op) String() string {
	names := make([]string, len(o.Nodes))
	for i, n := range o.Nodes {
		names[i] = NodeName(n)
	}
	s := fmt.Sprintf("%7.3fs %s %s %s", o.At.Seconds(), o.Nemesis, o.Kind, strings.Join(names, ","))
	if o.Detail != "" {
		s += " " + o.Detail
	}
	return s
}

// Nemesis is one family of faults. Planning (Next, Recover) happens ahead
// of the run, from the seeded source only, so a seed gives the same
// schedule every time; Apply then does each op to the real cluster, on the
// goroutine that runs the schedule.
//
// A new family (partitions through a fault proxy) is one type with these
// three methods, added to the list given to Schedule and Execute.
type Nemesis interface {
	// Name tags the ops this nemesis plans.
	Name() string
	// Next plans this nemesis's next op against w and updates w as the op
	// will; false when no op of this family fits w now.
	Next(rng *rand.Rand, w *World) (Op, bool)
	// Recover plans the ops that undo every fault of this family left in w
	// (the end of the fault phase), updating w.
	Recover(w *World) []Op
	// Apply does op to the cluster.
	Apply(op Op) error
}

// Schedule plans a fault phase of length d: an op every gap (uniform in
// [minGap, maxGap)) from a nemesis picked at random among those with one
// that fits, then at d every nemesis's Recover. Everything random comes
// from rng, so the schedule is a function of its seed.
func Schedule(rng *rand.Rand, w *World, nemeses []Nemesis, d, minGap, maxGap time.Duration) []Op {
	var ops []Op
	gap := func() time.Duration { return minGap + time.Duration(rng.Int64N(int64(maxGap-minGap)+1)) }
	for at := gap(); at < d; at += gap() {
		for _, i := range rng.Perm(len(nemeses)) {
			if op, ok := nemeses[i].Next(rng, w); ok {
				op.At, op.Nemesis, op.Healthy = at, nemeses[i].Name(), w.Healthy()
				ops = append(ops, op)
				break
			}
		}
	}
	for _, n := range nemeses {
		for _, op := range n.Recover(w) {
			op.At, op.Nemesis, op.Healthy = d, n.Name(), w.Healthy()
			ops = append(ops, op)
		}
	}
	return ops
}

// Faults is the live fault state while a schedule runs, for observers
// (the prober) on other goroutines: an epoch that changes around every op
// and whether the cluster is healthy. Safe for concurrent use.
type Faults struct {
	epoch   atomic.Int64 // odd while an op is being applied
	healthy atomic.Bool
}

// NewFaults starts healthy (every node up before the first op).
func NewFaults() *Faults {
	f := &Faults{}
	f.healthy.Store(true)
	return f
}

// Snapshot is the epoch and whether the cluster is healthy in it. Two
// equal snapshots around an observation mean no op ran meanwhile.
func (f *Faults) Snapshot() (epoch int64, healthy bool) {
	e := f.epoch.Load()
	h := f.healthy.Load()
	if f.epoch.Load() != e || e%2 == 1 {
		return e, false
	}
	return e, h
}

// Execute runs ops in order, each no earlier than origin+op.At on rec's
// clock, recording one event per op (process "nemesis"). It returns the
// first error of an Apply, or ctx's error.
func Execute(ctx context.Context, rec *Recorder, faults *Faults, origin time.Duration, ops []Op, nemeses []Nemesis) error {
	byName := map[string]Nemesis{}
	for _, n := range nemeses {
		byName[n.Name()] = n
	}
	for _, op := range ops {
		n, ok := byName[op.Nemesis]
		if !ok {
			return fmt.Errorf("jepsen: op %v of unknown nemesis %q", op, op.Nemesis)
		}
		if wait := origin + op.At - rec.Now(); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return ctx.Err()
			case <-timer.C:
			}
		}
		faults.healthy.Store(false)
		faults.epoch.Add(1)
		start := rec.Now()
		err := n.Apply(op)
		e := Event{Process: "nemesis", Node: -1, Kind: op.Kind, Outcome: OK, Start: start,
			Nodes: op.Nodes, Detail: op.Detail}
		if err != nil {
			e.Outcome, e.Err = Fail, err.Error()
		}
		rec.Record(e)
		faults.healthy.Store(op.Healthy)
		faults.epoch.Add(1)
		if err != nil {
			return fmt.Errorf("jepsen: %v: %w", op, err)
		}
	}
	return nil
}

// Processes is what the kill nemesis acts on: the cluster's server
// processes, by node.
type Processes interface {
	// Kill kills node's process with SIGKILL and waits for it to exit.
	Kill(node int) error
	// Start starts node again on its data directory and waits until it
	// serves.
	Start(node int) error
}

// KillNemesis kills one or two nodes with SIGKILL (never more than MaxDown
// at once, so a REPLICATE 3 add can still find its nodes), restarts them on
// their directories, and now and then kills every node at once and then
// restarts them all.
type KillNemesis struct {
	Procs Processes
	// MaxDown bounds the nodes down at once, outside a kill of all.
	MaxDown int
	// AllEvery: on average one op in AllEvery, with every node up, kills
	// them all (0: never).
	AllEvery int
}

// Name is "kill".
func (k *KillNemesis) Name() string { return "kill" }

// Next: with every node down (after a kill of all), start them all;
// otherwise kill one or two more while fewer than MaxDown are down,
// start one or all of the down ones, or kill all.
func (k *KillNemesis) Next(rng *rand.Rand, w *World) (Op, bool) {
	up, down := w.Up(), w.DownNodes()
	if len(up) == 0 {
		return k.start(w, down), true
	}
	if len(down) == 0 && k.AllEvery > 0 && rng.IntN(k.AllEvery) == 0 {
		for i := range w.Down {
			w.Down[i] = true
		}
		return Op{Kind: Kill, Nodes: up, Detail: "all"}, true
	}
	canKill := len(down) < k.MaxDown
	if len(down) > 0 && (!canKill || rng.IntN(2) == 0) {
		if len(down) > 1 && rng.IntN(2) == 0 {
			return k.start(w, down), true
		}
		return k.start(w, []int{down[rng.IntN(len(down))]}), true
	}
	if !canKill {
		return Op{}, false
	}
	n := 1 + rng.IntN(min(2, k.MaxDown-len(down)))
	rng.Shuffle(len(up), func(i, j int) { up[i], up[j] = up[j], up[i] })
	victims := slices.Sorted(slices.Values(up[:n]))
	for _, v := range victims {
		w.Down[v] = true
	}
	return Op{Kind: Kill, Nodes: victims}, true
}

func (k *KillNemesis) start(w *World, nodes []int) Op {
	for _, n := range nodes {
		w.Down[n] = false
	}
	return Op{Kind: Start, Nodes: slices.Clone(nodes)}
}

// Recover starts every node down.
func (k *KillNemesis) Recover(w *World) []Op {
	if down := w.DownNodes(); len(down) > 0 {
		return []Op{k.start(w, down)}
	}
	return nil
}

// Apply kills or starts op's nodes in order.
func (k *KillNemesis) Apply(op Op) error {
	for _, n := range op.Nodes {
		var err error
		switch op.Kind {
		case Kill:
			err = k.Procs.Kill(n)
		case Start:
			err = k.Procs.Start(n)
		default:
			err = fmt.Errorf("kill nemesis: op kind %q", op.Kind)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", op.Kind, NodeName(n), err)
		}
	}
	return nil
}
