package jepsen

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// NemesisContext is how far before the first and after the last event of a
// shrunk history its nemesis events are kept: a kill a few seconds before
// an ADDJOB explains it (RETRY, node timeout).
const NemesisContext = 5 * time.Second

// Shrink returns the smallest sub-history of h found that still breaks v:
// the events of v's job, reduced greedily (an event whose removal keeps the
// violation goes), plus every nemesis event from NemesisContext before the
// first kept event to NemesisContext after the last one, so the faults
// around the job show. Nemesis events never decide a rule, so they are
// context, not part of the search.
func Shrink(h History, v Violation) History {
	mine := jobEvents(h, v)
	if !breaks(mine, v) {
		// Cannot happen for the rules Check has (each is about one job);
		// keep the whole of the job's events rather than a wrong shrink.
		return withContext(h, mine)
	}
	for i := 0; i < len(mine); {
		try := slices.Delete(slices.Clone(mine), i, i+1)
		if breaks(try, v) {
			mine = try
			continue
		}
		i++
	}
	return withContext(h, mine)
}

// JobEvents is every event of v's job (by its body and every id it had),
// with no nemesis context.
func JobEvents(h History, v Violation) History { return jobEvents(h, v).Sorted() }

func jobEvents(h History, v Violation) History {
	ids := map[string]bool{}
	if v.ID != "" {
		ids[v.ID] = true
	}
	for _, e := range h {
		if v.Body != "" && e.Kind == Add && e.Body == v.Body && e.ID != "" {
			ids[e.ID] = true
		}
		for _, d := range e.Jobs {
			if v.Body != "" && d.Body == v.Body {
				ids[d.ID] = true
			}
		}
	}
	var mine History
	for _, e := range h {
		if e.Nemesis() {
			continue
		}
		if e.mentions("", v.Body) {
			mine = append(mine, e)
			continue
		}
		for id := range ids {
			if e.mentions(id, "") {
				mine = append(mine, e)
				break
			}
		}
	}
	return mine
}

// breaks reports whether Check finds v (same rule, same job) in h.
func breaks(h History, v Violation) bool {
	for _, w := range Check(h) {
		if w.Rule == v.Rule && (w.Body == v.Body || (v.ID != "" && w.ID == v.ID)) {
			return true
		}
	}
	return false
}

// withContext adds to mine h's nemesis events near mine's span.
func withContext(h, mine History) History {
	if len(mine) == 0 {
		return nil
	}
	from, to := mine[0].Start, mine[0].End
	for _, e := range mine {
		from, to = min(from, e.Start), max(to, e.End)
	}
	out := slices.Clone(mine)
	for _, e := range h {
		if e.Nemesis() && e.End >= from-NemesisContext && e.Start <= to+NemesisContext {
			out = append(out, e)
		}
	}
	return out.Sorted()
}

// Report is the text a failed run prints: the seed, the counts, and for
// each violation (at most max of them) its shrunk history.
func Report(seed uint64, h History, vs []Violation, max int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %s\n", seed, h.Count())
	if len(vs) == 0 {
		b.WriteString("no violations\n")
		return b.String()
	}
	byRule := map[Rule]int{}
	for _, v := range vs {
		byRule[v.Rule]++
	}
	fmt.Fprintf(&b, "%d violations:", len(vs))
	for _, r := range []Rule{Lost, Duplicated, DeliveredAfterGone, NotCollected, LeftoverDummy, WrongBody} {
		if byRule[r] > 0 {
			fmt.Fprintf(&b, " %s %d", r, byRule[r])
		}
	}
	b.WriteString("\n")
	for i, v := range vs {
		if i == max {
			fmt.Fprintf(&b, "… %d more violations not shown\n", len(vs)-max)
			break
		}
		fmt.Fprintf(&b, "\n%s\nsmallest history (reproduce with -jepsen.seed=%d):\n%s", v, seed, Shrink(h, v))
		if all := JobEvents(h, v); len(all) <= 30 {
			fmt.Fprintf(&b, "all of the job's events:\n%s", all)
		}
	}
	return b.String()
}
