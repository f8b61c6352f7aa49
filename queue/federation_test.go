package queue

import (
	"slices"
	"testing"
)

// kinds summarises a plan: "b" for a broadcast, "a<count>" for a NEEDJOBS
// to the sources.
func kinds(reqs []NeedJobsRequest) []string {
	var out []string
	for _, r := range reqs {
		if r.Nodes == nil {
			if r.Count != 1 {
				return []string{"broadcast of count != 1"}
			}
			out = append(out, "b")
		} else {
			out = append(out, "a"+itoa(r.Count))
		}
	}
	return out
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestNeedJobsBroadcastPacing: with no source, a waiting queue broadcasts
// at once, then after more than 4 s, 8 s, 16 s and then every 30 s
// (Disque's NEEDJOBS_BCAST_ALL_MIN/MAX_DELAY: 2 s doubled at each
// broadcast, the first one at once), never in between; a
// reached-zero call without imports asks nothing.
func TestNeedJobsBroadcastPacing(t *testing.T) {
	const t0 = 1_000_000
	f := newFederation(t0)
	var at []int64
	for now := int64(t0); now <= t0+130_000; now += 10 {
		if got := kinds(f.plan("q", now, true)); len(got) != 0 {
			t.Fatalf("reached-zero with no import at %d: %v", now-t0, got)
		}
		got := kinds(f.plan("q", now, false))
		switch {
		case len(got) == 0:
		case slices.Equal(got, []string{"b"}):
			at = append(at, now-t0)
		default:
			t.Fatalf("at %d: %v", now-t0, got)
		}
	}
	want := []int64{0, 4010, 12020, 28030, 58040, 88050, 118060}
	if !slices.Equal(at, want) {
		t.Fatalf("broadcasts at %v, want %v", at, want)
	}
}

// TestNeedJobsSourcePacing: once a node sent jobs, the queue asks it at
// once, then after 50 ms doubling to 2 s (25 ms doubled at each NEEDJOBS;
// at once when the queue reached zero); a new source restarts the
// broadcasts at 2 s; the
// count is the import rate divided among the sources, clamped 5..100.
func TestNeedJobsSourcePacing(t *testing.T) {
	const t0 = 1_000_000
	const a, b = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	f := newFederation(t0)
	if got := kinds(f.plan("q", t0, false)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("first plan %v", got)
	}
	f.imported(a, 1, t0+1)
	// Ad hoc to a: after 25, 50, 100, … ms, never more than 2 s apart.
	var at, bcast []int64
	for now := int64(t0 + 1); now <= t0+6000; now++ {
		for _, r := range f.plan("q", now, false) {
			if r.Nodes == nil {
				bcast = append(bcast, now-t0)
				continue
			}
			if !slices.Equal(r.Nodes, []string{a}) || r.Count < needJobsMinCount || r.Count > needJobsMaxCount {
				t.Fatalf("ad hoc %+v", r)
			}
			at = append(at, now-t0)
		}
		if now == t0+3000 {
			break
		}
	}
	want := []int64{1, 52, 153, 354, 755, 1556}
	if !slices.Equal(at, want) {
		t.Fatalf("ad hoc NEEDJOBS at %v, want %v", at, want)
	}
	// The new source made broadcasts start over: 2 s after the last.
	if !slices.Equal(bcast, []int64{2001}) {
		t.Fatalf("broadcasts at %v, want [2001]", bcast)
	}
	// Then every 2 s at most.
	if got := kinds(f.plan("q", t0+3557, false)); !slices.Equal(got, []string{"a5"}) {
		t.Fatalf("2 s after the last: %v", got)
	}
	// Reached zero while importing: at once, whatever the last one.
	f.imported(a, 1, t0+3558)
	if got := kinds(f.plan("q", t0+3559, true)); len(got) != 1 || got[0][0] != 'a' {
		t.Fatalf("reached zero: %v", got)
	}
	if got := kinds(f.plan("q", t0+3560, true)); len(got) != 1 || got[0][0] != 'a' {
		t.Fatalf("reached zero again: %v", got)
	}

	// 400 jobs/s from two sources: 200 each, clamped to 100; 12 jobs/s
	// from two: 6 each.
	g := newFederation(t0)
	g.plan("q", t0, false)
	for i := range 400 {
		src := a
		if i%2 == 1 {
			src = b
		}
		g.imported(src, 1, t0+int64(i)*2) // over 0.8 s
	}
	reqs := g.plan("q", t0+900, true)
	if len(reqs) != 1 || reqs[0].Count != needJobsMaxCount || !slices.Equal(reqs[0].Nodes, []string{a, b}) {
		t.Fatalf("400/s from a and b: %+v", reqs)
	}
	if r := g.importRate(t0 + 900); r < 400 {
		t.Fatalf("import rate %d, want ≥ 400", r)
	}
	h := newFederation(t0)
	h.plan("q", t0, false)
	for i := range 12 {
		h.imported([]string{a, b}[i%2], 1, t0+int64(i)*80)
	}
	reqs = h.plan("q", t0+1000, true)
	if len(reqs) != 1 || reqs[0].Count != 6 {
		t.Fatalf("12 jobs/s from two sources: %+v (rate %d)", reqs, h.importRate(t0+1000))
	}
	// Sources expire after 5 s of silence, and the rate drops to 0.
	if got := h.validSources(t0 + 7000); len(got) != 0 {
		t.Fatalf("sources after 6 s of silence: %v", got)
	}
	if r := h.importRate(t0 + 7000); r != 0 {
		t.Fatalf("rate after 6 s of silence: %d", r)
	}
}
