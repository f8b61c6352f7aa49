package queue

import (
	"cmp"
	"flag"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/diskque/diskque/storage"
)

// TestWheelDataDriven runs the scripts in testdata/wheel (regenerate the
// expected output with -rewrite, then read it). After every command the
// harness checks the wheel's invariants (checkInvariants) and fails on a
// broken one.
//
// Times are Unix ms, or relative to the wheel's Now when they start with + or
// -, with an optional unit: ms (default), s, m, h, d, y (365 d).
//
//	init now=<time>
//	add id=<id> kind=delay|retry|ttl due=<time>   prints ok or out of span
//	remove id=<id> kind=<kind>                    prints removed or absent
//	remove-all id=<id>                            prints how many it removed
//	on-fire id=<id> kind=<kind>                   the input lines (add, remove,
//	    remove-all commands; times relative to Now at firing) run once, from
//	    inside fire, when that event fires
//	advance now=<time> [limit=<n>] [steps]   the fired events, "<due> <kind>
//	    <id>" with the on-fire actions under them, then the wheel's now (and
//	    the loop iterations this call made); with limit, one AdvanceLimit
//	    call, followed by "more" when it stopped at the limit
//	len | next | show            show: the occupied slots, level by level in
//	    tick order, and the overdue list
func TestWheelDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/wheel", func(t *testing.T, path string) {
		h := &wheelHarness{}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			out := h.run(t, td)
			if h.w != nil {
				if err := h.w.checkInvariants(); err != nil {
					t.Fatalf("%s: after %s: %v", td.Pos, td.Cmd, err)
				}
			}
			return out
		})
	})
}

// wheelKey identifies an event in the tests' models: one per (ID, Kind).
type wheelKey struct {
	id   string
	kind storage.EventKind
}

type wheelHarness struct {
	w      *Wheel
	onFire map[wheelKey][]string
}

func (h *wheelHarness) run(t *testing.T, td *datadriven.TestData) string {
	if td.Cmd != "init" && h.w == nil {
		td.Fatalf(t, "init first")
	}
	switch td.Cmd {
	case "init":
		now, err := wheelTime(wheelArg(t, td.CmdArgs, "now"), 0)
		if err != nil {
			td.Fatalf(t, "%v", err)
		}
		h.w, h.onFire = NewWheel(now), map[wheelKey][]string{}
		return ""
	case "on-fire":
		k := wheelKey{wheelArg(t, td.CmdArgs, "id"), wheelKind(t, wheelArg(t, td.CmdArgs, "kind"))}
		h.onFire[k] = strings.Split(strings.TrimSpace(td.Input), "\n")
		return ""
	case "advance":
		now, err := wheelTime(wheelArg(t, td.CmdArgs, "now"), h.w.Now())
		if err != nil {
			td.Fatalf(t, "%v", err)
		}
		var b strings.Builder
		steps := h.w.steps
		limit := math.MaxInt
		if td.HasArg("limit") {
			td.ScanArgs(t, "limit", &limit)
		}
		more := h.w.AdvanceLimit(now, limit, func(e storage.Event) {
			fmt.Fprintf(&b, "%d %s %s\n", e.Due, e.Kind, e.ID)
			k := wheelKey{e.ID, e.Kind}
			actions := h.onFire[k]
			delete(h.onFire, k)
			for _, line := range actions {
				cmd, args, err := datadriven.ParseLine(line)
				if err != nil {
					td.Fatalf(t, "%v", err)
				}
				fmt.Fprintf(&b, "  %s at now=%d: %s\n", line, h.w.Now(), h.exec(t, cmd, args))
			}
		})
		if more {
			b.WriteString("more\n")
		}
		fmt.Fprintf(&b, "now=%d\n", h.w.Now())
		if td.HasArg("steps") {
			fmt.Fprintf(&b, "steps=%d\n", h.w.steps-steps)
		}
		return b.String()
	case "len":
		return fmt.Sprintln(h.w.Len())
	case "next":
		if next, ok := h.w.Next(); ok {
			return fmt.Sprintln(next)
		}
		return "none\n"
	case "show":
		return h.w.show()
	}
	return h.exec(t, td.Cmd, td.CmdArgs) + "\n"
}

// exec runs the commands that also work from inside fire.
func (h *wheelHarness) exec(t *testing.T, cmd string, args []datadriven.CmdArg) string {
	switch cmd {
	case "add":
		due, err := wheelTime(wheelArg(t, args, "due"), h.w.Now())
		if err != nil {
			t.Fatal(err)
		}
		e := storage.Event{ID: wheelArg(t, args, "id"), Kind: wheelKind(t, wheelArg(t, args, "kind")), Due: due}
		if h.w.Add(e) {
			return "ok"
		}
		return "out of span"
	case "remove":
		if h.w.Remove(wheelArg(t, args, "id"), wheelKind(t, wheelArg(t, args, "kind"))) {
			return "removed"
		}
		return "absent"
	case "remove-all":
		return fmt.Sprintf("removed %d", h.w.RemoveAll(wheelArg(t, args, "id")))
	}
	t.Fatalf("unknown command %q", cmd)
	return ""
}

func wheelArg(t *testing.T, args []datadriven.CmdArg, key string) string {
	for _, a := range args {
		if a.Key == key && len(a.Vals) == 1 {
			return a.Vals[0]
		}
	}
	t.Fatalf("missing argument %s=", key)
	return ""
}

func wheelKind(t *testing.T, s string) storage.EventKind {
	for _, k := range []storage.EventKind{storage.EventDelay, storage.EventRetry, storage.EventTTL} {
		if s == k.String() || s == string(rune(k)) {
			return k
		}
	}
	t.Fatalf("unknown kind %q", s)
	return 0
}

// wheelTime parses an absolute time, or a relative one (+N or -N, with an
// optional unit) from now.
func wheelTime(s string, now int64) (int64, error) {
	if s == "" || (s[0] != '+' && s[0] != '-') {
		return strconv.ParseInt(s, 10, 64)
	}
	units := []struct {
		suffix string
		ms     int64
	}{{"ms", 1}, {"s", 1000}, {"m", 60_000}, {"h", 3_600_000}, {"d", 86_400_000}, {"y", 365 * 86_400_000}}
	num, unit := s[1:], int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, unit = n, u.ms
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, err
	}
	if s[0] == '-' {
		n = -n
	}
	return now + n*unit, nil
}

// show prints the occupied slots of each level in tick order, then the
// overdue list.
func (w *Wheel) show() string {
	var b strings.Builder
	for l := range wheelLevels {
		c := int(w.now>>(wheelBits*l)) & (wheelSlots - 1)
		for k := 1; k <= wheelSlots; k++ {
			s := (c + k) & (wheelSlots - 1)
			if len(w.slots[l][s]) == 0 {
				continue
			}
			fmt.Fprintf(&b, "level %d slot %d min=%d:", l, s, w.slotMin[l][s])
			for _, e := range sortedEvents(w.slots[l][s]) {
				fmt.Fprintf(&b, " %d %s %s,", e.Due, e.Kind, e.ID)
			}
			b.WriteString("\n")
		}
	}
	if w.overdueLive > 0 {
		b.WriteString("overdue:")
		for _, e := range sortedEvents(w.overdue) {
			fmt.Fprintf(&b, " %d %s %s,", e.Due, e.Kind, e.ID)
		}
		b.WriteString("\n")
	}
	if b.Len() == 0 {
		return "empty\n"
	}
	return b.String()
}

func sortedEvents(list []*wheelEntry) []storage.Event {
	var evs []storage.Event
	for _, en := range list {
		if en != nil {
			evs = append(evs, en.ev)
		}
	}
	slices.SortFunc(evs, cmpWheelEvent)
	return evs
}

func cmpWheelEvent(a, b storage.Event) int {
	return cmp.Or(cmp.Compare(a.Due, b.Due), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID))
}

// checkInvariants verifies the invariants of the Wheel doc comment.
func (w *Wheel) checkInvariants() error {
	held := 0
	chained := 0
	for id, head := range w.index {
		kinds := map[storage.EventKind]bool{}
		for x := head; x != nil; x = x.next {
			if x.ev.ID != id || kinds[x.ev.Kind] {
				return fmt.Errorf("entry %v in the chain of %q (kinds before: %v)", x.ev, id, kinds)
			}
			kinds[x.ev.Kind] = true
			chained++
		}
	}
	if chained != w.held {
		return fmt.Errorf("index chains hold %d entries, held says %d", chained, w.held)
	}
	if w.memoOK && w.index[w.memoID] != w.memoHead {
		return fmt.Errorf("memo of %q says first entry %p, index has %p", w.memoID, w.memoHead, w.index[w.memoID])
	}
	checkIndex := func(en *wheelEntry) error {
		if _, x, _ := w.find(en.ev.ID, en.ev.Kind); x != en {
			return fmt.Errorf("entry %v is not the index's", en.ev)
		}
		held++
		return nil
	}
	for l := range wheelLevels {
		shift := wheelBits * l
		for s := range wheelSlots {
			list := w.slots[l][s]
			if (len(list) > 0) != (w.mask[l]&(1<<s) != 0) {
				return fmt.Errorf("level %d slot %d: %d entries, mask %064b", l, s, len(list), w.mask[l])
			}
			if len(list) == 0 {
				if list != nil {
					return fmt.Errorf("level %d slot %d: empty slot keeps an array", l, s)
				}
				continue
			}
			tick := w.slotMin[l][s] >> shift
			diff := tick - w.now>>shift
			if int(tick&(wheelSlots-1)) != s || diff < 1 || diff > wheelSlots || (diff == wheelSlots && l < wheelLevels-1) {
				return fmt.Errorf("level %d slot %d: slotMin %d (tick %d) at now %d", l, s, w.slotMin[l][s], tick, w.now)
			}
			for i, en := range list {
				d := en.ev.Due
				switch {
				case int(en.level) != l || int(en.slot) != s || int(en.pos) != i:
					return fmt.Errorf("%v: says level %d slot %d pos %d, is at %d %d %d", en.ev, en.level, en.slot, en.pos, l, s, i)
				case d>>shift != tick || d < w.slotMin[l][s]:
					return fmt.Errorf("%v: not in the tick of level %d slot %d (slotMin %d)", en.ev, l, s, w.slotMin[l][s])
				}
				if err := checkIndex(en); err != nil {
					return err
				}
			}
		}
	}
	live := 0
	var last *wheelEntry
	for i, en := range w.overdue {
		if en == nil {
			continue
		}
		if i < w.overdueStart {
			return fmt.Errorf("overdue %v at %d, before the start %d", en.ev, i, w.overdueStart)
		}
		if en.ev.Due > w.overdueMax {
			return fmt.Errorf("overdue %v after overdueMax %d", en.ev, w.overdueMax)
		}
		if last != nil && !w.overdueUnsorted && en.ev.Due < last.ev.Due {
			return fmt.Errorf("overdue %v after %v, not marked unsorted", en.ev, last.ev)
		}
		last = en
		live++
		if en.level != overdueLevel || int(en.pos) != i || en.ev.Due > w.now || en.ev.Due < w.overdueMin {
			return fmt.Errorf("overdue %v: level %d pos %d (at %d), now %d, overdueMin %d", en.ev, en.level, en.pos, i, w.now, w.overdueMin)
		}
		if err := checkIndex(en); err != nil {
			return err
		}
	}
	if live != w.overdueLive || held != w.held {
		return fmt.Errorf("overdue %d live (counted %d); index %d, placed %d", live, w.overdueLive, w.held, held)
	}
	return nil
}

var wheelSeed = flag.Uint64("wheel.seed", 0, "seed of TestWheelRandom (0: from the clock)")

// wheelModel is the reference: a map of events, fired by repeatedly taking
// the earliest.
type wheelModel struct {
	now int64
	evs map[wheelKey]storage.Event
}

func (m *wheelModel) add(e storage.Event) bool {
	k := wheelKey{e.ID, e.Kind}
	if e.Due > m.now && e.Due-m.now >= WheelSpan {
		delete(m.evs, k)
		return false
	}
	m.evs[k] = e
	return true
}

func (m *wheelModel) advance(to int64) []storage.Event {
	target, before := max(to, m.now), m.now
	var fired []storage.Event
	for {
		var first storage.Event
		found := false
		for _, e := range m.evs {
			if e.Due <= target && (!found || cmpWheelEvent(e, first) < 0) {
				first, found = e, true
			}
		}
		if !found {
			break
		}
		delete(m.evs, wheelKey{first.ID, first.Kind})
		fired = append(fired, first)
		m.now = max(first.Due, before) // the wheel's Now inside fire
		if c, ok := wheelChild(first, m.now); ok {
			m.add(c)
		}
	}
	m.now = target
	return fired
}

// wheelChild decides, as a function of the fired event alone, whether fire
// schedules a follow-up event, due at least 1 ms after the firing time now.
// Child ids are unique per (parent, due), so the outcome does not depend on
// the order of events firing in the same millisecond.
func wheelChild(e storage.Event, now int64) (storage.Event, bool) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%c/%d", e.ID, e.Kind, e.Due)
	x := h.Sum64()
	if x%4 != 0 || strings.Count(e.ID, "@") >= 2 {
		return storage.Event{}, false
	}
	delta := 1 + int64(x>>8%5000)
	if x%3 == 0 {
		delta = 1 + int64(x>>20%(1<<24))
	}
	return storage.Event{Due: now + delta, Kind: e.Kind, ID: fmt.Sprintf("%s@%d", e.ID, e.Due)}, true
}

// TestWheelRandom checks the wheel against wheelModel over random adds,
// replacements, removals and advances at every level, fire adding follow-up
// events from inside Advance.
func TestWheelRandom(t *testing.T) {
	seed := *wheelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -wheel.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ops := 20_000
	if testing.Short() {
		ops = 3_000
	}
	start := 1_700_000_000_000 + rng.Int64N(1<<40)
	w := NewWheel(start)
	m := &wheelModel{now: start, evs: map[wheelKey]storage.Event{}}
	ids := make([]string, 150)
	for i := range ids {
		ids[i] = fmt.Sprintf("j%03d", i)
	}
	kinds := []storage.EventKind{storage.EventDelay, storage.EventRetry, storage.EventTTL}
	// delta is up to 64^(l+1) ms for a random level l <= maxLevel, smaller
	// levels more likely.
	delta := func(maxLevel int) int64 {
		l := rng.IntN(maxLevel + 1)
		if rng.IntN(2) == 0 {
			l = rng.IntN(l + 1)
		}
		return rng.Int64N(int64(1) << (wheelBits * (l + 1)))
	}
	var adds, refused, removes, advances, fired int
	for op := range ops {
		switch r := rng.IntN(100); {
		case r < 50:
			e := storage.Event{ID: ids[rng.IntN(len(ids))], Kind: kinds[rng.IntN(len(kinds))]}
			switch x := rng.IntN(100); {
			case x < 5:
				e.Due = w.Now() - rng.Int64N(5000) // overdue
			case x < 9:
				e.Due = w.Now() + WheelSpan - 2 + rng.Int64N(4) // the span's edge
			default:
				e.Due = w.Now() + 1 + delta(5)
			}
			got, want := w.Add(e), m.add(e)
			if got != want {
				t.Fatalf("op %d: Add(%v) = %v at now %d, want %v", op, e, got, w.Now(), want)
			}
			adds++
			if !got {
				refused++
			}
		case r < 62:
			id, kind := ids[rng.IntN(len(ids))], kinds[rng.IntN(len(kinds))]
			_, want := m.evs[wheelKey{id, kind}]
			delete(m.evs, wheelKey{id, kind})
			if got := w.Remove(id, kind); got != want {
				t.Fatalf("op %d: Remove(%s, %s) = %v, want %v", op, id, kind, got, want)
			}
			removes++
		case r < 67:
			id, want := ids[rng.IntN(len(ids))], 0
			for _, kind := range kinds {
				if _, ok := m.evs[wheelKey{id, kind}]; ok {
					delete(m.evs, wheelKey{id, kind})
					want++
				}
			}
			if got := w.RemoveAll(id); got != want {
				t.Fatalf("op %d: RemoveAll(%s) = %d, want %d", op, id, got, want)
			}
			removes++
		default:
			to := w.Now() + delta(6)
			if rng.IntN(20) == 0 {
				to = w.Now() - rng.Int64N(1000)
			}
			var got []storage.Event
			fire := func(e storage.Event) {
				got = append(got, e)
				if c, ok := wheelChild(e, w.Now()); ok {
					w.Add(c)
				}
			}
			if rng.IntN(2) == 0 {
				w.Advance(to, fire)
			} else {
				// In pieces of at most limit events: together they must
				// fire what one Advance fires.
				limit := 1 + rng.IntN(8)
				for calls := 1; ; calls++ {
					before := len(got)
					more := w.AdvanceLimit(to, limit, fire)
					if n := len(got) - before; n > limit || more && n != limit {
						t.Fatalf("op %d: AdvanceLimit(%d, %d) fired %d, more=%v", op, to, limit, n, more)
					}
					if !more {
						break
					}
					if err := w.checkInvariants(); err != nil {
						t.Fatalf("op %d: between AdvanceLimit calls: %v", op, err)
					}
					if calls > 100_000 {
						t.Fatalf("op %d: AdvanceLimit(%d, %d) never finishes", op, to, limit)
					}
				}
			}
			want := m.advance(to)
			for i := 1; i < len(got); i++ {
				if got[i].Due < got[i-1].Due {
					t.Fatalf("op %d: Advance(%d) fired %v after %v", op, to, got[i], got[i-1])
				}
			}
			slices.SortFunc(got, cmpWheelEvent)
			if !slices.Equal(got, want) {
				t.Fatalf("op %d: Advance(%d) from %d fired\n%v\nwant\n%v", op, to, m.now, got, want)
			}
			advances++
			fired += len(got)
		}
		if w.Len() != len(m.evs) || w.Now() != m.now {
			t.Fatalf("op %d: Len %d Now %d, want %d %d", op, w.Len(), w.Now(), len(m.evs), m.now)
		}
		if err := w.checkInvariants(); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
		next, ok := w.Next()
		if ok != (len(m.evs) > 0) {
			t.Fatalf("op %d: Next ok=%v with %d events", op, ok, len(m.evs))
		}
		if ok {
			earliest := slices.MinFunc(slices.Collect(maps.Values(m.evs)), cmpWheelEvent).Due
			if next > earliest || (earliest > w.Now() && next <= w.Now()) {
				t.Fatalf("op %d: Next %d, earliest %d, now %d", op, next, earliest, w.Now())
			}
		}
	}
	t.Logf("%d adds (%d refused), %d removes, %d advances fired %d events, %d steps",
		adds, refused, removes, advances, fired, w.steps)
}

// TestWheelLongJump checks that Advance over years costs iterations for the
// events it meets, not for the milliseconds it skips.
func TestWheelLongJump(t *testing.T) {
	const day = 86_400_000
	start := int64(1_700_000_000_123)
	w := NewWheel(start)
	w.Advance(start+10*365*day, func(e storage.Event) { t.Fatalf("fired %v", e) })
	if w.steps != 0 || w.Now() != start+10*365*day {
		t.Fatalf("empty wheel: %d steps, now %d", w.steps, w.Now())
	}

	start = w.Now()
	evs := []storage.Event{
		{Due: start + 1, Kind: storage.EventRetry, ID: "a"},
		{Due: start + 100*day, Kind: storage.EventDelay, ID: "b"},
		{Due: start + 700*day, Kind: storage.EventTTL, ID: "c"},
	}
	for _, e := range slices.Backward(evs) {
		if !w.Add(e) {
			t.Fatalf("Add(%v) refused", e)
		}
	}
	// A removed earliest event leaves a stale slotMin: one more visit.
	w.Add(storage.Event{Due: start + 700*day - 1, Kind: storage.EventTTL, ID: "gone"})
	w.Remove("gone", storage.EventTTL)

	var got []storage.Event
	w.Advance(start+10*365*day, func(e storage.Event) { got = append(got, e) })
	if !slices.Equal(got, evs) {
		t.Fatalf("fired %v, want %v", got, evs)
	}
	if w.steps > 4 {
		t.Fatalf("%d steps for 3 events and a removed one", w.steps)
	}
	if w.Len() != 0 {
		t.Fatalf("Len %d", w.Len())
	}
}

// TestWheelCascadeOnce checks that an event at level 5 in the slot of now's
// own tick (64 ticks ahead) is not moved while time stays in that tick, and
// that an event cascades at most once per level.
func TestWheelCascadeOnce(t *testing.T) {
	w := NewWheel(1000)
	far := storage.Event{Due: 1000 + WheelSpan - 1, Kind: storage.EventTTL, ID: "far"}
	if _, en, _ := w.find(far.ID, far.Kind); !w.Add(far) || en != nil {
		t.Fatal("far event held before its Add")
	}
	if _, en, _ := w.find(far.ID, far.Kind); en == nil || en.level != wheelLevels-1 {
		t.Fatalf("far event not at level %d", wheelLevels-1)
	}
	fired := 0
	for range 1000 {
		w.Add(storage.Event{Due: w.Now() + 1, Kind: storage.EventRetry, ID: "tick"})
		w.Advance(w.Now()+1, func(storage.Event) { fired++ })
	}
	if fired != 1000 || w.steps != 1000 || w.cascaded != 0 {
		t.Fatalf("fired %d in %d steps, %d entries cascaded", fired, w.steps, w.cascaded)
	}
	w.Advance(far.Due, func(e storage.Event) {
		if e != far {
			t.Fatalf("fired %v", e)
		}
		fired++
	})
	if fired != 1001 || w.cascaded > wheelLevels-1 {
		t.Fatalf("fired %d, %d entries cascaded", fired, w.cascaded)
	}
}

// TestWheelAdvanceFromFire checks that Advance refuses to run inside fire and
// that the wheel stays usable after a panicking fire.
func TestWheelAdvanceFromFire(t *testing.T) {
	w := NewWheel(0)
	w.Add(storage.Event{Due: 5, Kind: storage.EventRetry, ID: "a"})
	w.Add(storage.Event{Due: 5, Kind: storage.EventRetry, ID: "b"})
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "inside fire") {
				t.Fatalf("recovered %v", r)
			}
		}()
		w.Advance(10, func(storage.Event) { w.Advance(20, nil) })
	}()
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	n := 0
	w.Advance(10, func(storage.Event) { n++ })
	if n != 1 || w.Len() != 0 {
		t.Fatalf("after the panic: fired %d, Len %d", n, w.Len())
	}
}

// BenchmarkWheelAddAdvance adds 1M events due within an hour, then advances
// through the hour in steps, as the server loop would; ns/event covers one
// Add and one firing.
func BenchmarkWheelAddAdvance(b *testing.B) {
	const (
		events = 1_000_000
		hour   = 3_600_000
		start  = 1_700_000_000_000
	)
	rng := rand.New(rand.NewPCG(1, 2))
	evs := make([]storage.Event, events)
	for i := range evs {
		evs[i] = storage.Event{Due: start + 1 + rng.Int64N(hour), Kind: storage.EventRetry, ID: fmt.Sprintf("D-%08x-%024x-%04x", i, rng.Uint64(), i&0xffff)}
	}
	for _, step := range []int64{1, 10} {
		b.Run(fmt.Sprintf("step=%dms", step), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := NewWheel(start)
				for _, e := range evs {
					w.Add(e)
				}
				fired := 0
				for now := start + step; now <= start+hour+step; now += step {
					w.Advance(now, func(storage.Event) { fired++ })
				}
				if fired != events {
					b.Fatalf("fired %d", fired)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
		})
	}
}

// TestWheelRemoveAllOfANewJob checks that what a replica does for every
// new copy — RemoveAll of an id the wheel does not hold, then its retry and
// WILLQUEUE events — costs one index operation for the RemoveAll and three
// for the two Adds (two lookups, one insert), whatever the number of kinds
// the wheel has seen:
// on a replica's wheel of 200k events each lookup is a cache miss, and
// RemoveAll looked up every kind ever added (four), which was 6-8% of a
// replica's CPU at REPLICATE 3.
func TestWheelRemoveAllOfANewJob(t *testing.T) {
	w := NewWheel(1000)
	for i, kind := range []storage.EventKind{storage.EventDelay, storage.EventRetry, storage.EventTTL, eventWillQueue} {
		w.Add(storage.Event{Due: 2000 + int64(i), Kind: kind, ID: fmt.Sprintf("other-%d", i)})
	}
	before := w.indexOps
	if n := w.RemoveAll("new"); n != 0 {
		t.Fatalf("RemoveAll removed %d", n)
	}
	if got := w.indexOps - before; got != 1 {
		t.Fatalf("RemoveAll of an id not held: %d index operations, want 1", got)
	}
	before = w.indexOps
	w.Add(storage.Event{Due: 5000, Kind: storage.EventRetry, ID: "new"})
	w.Add(storage.Event{Due: 4000, Kind: eventWillQueue, ID: "new"})
	if got := w.indexOps - before; got > 3 {
		t.Fatalf("two Adds of a new id: %d index operations, want at most 3", got)
	}
	if !w.Holds("new", storage.EventRetry) || !w.Holds("new", eventWillQueue) || w.Holds("new", storage.EventTTL) || w.Len() != 6 {
		t.Fatalf("Holds or Len (%d) wrong", w.Len())
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if n := w.RemoveAll("new"); n != 2 || w.Len() != 4 || w.Holds("new", storage.EventRetry) {
		t.Fatalf("RemoveAll removed %d, Len %d", n, w.Len())
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncTimersOfANewCopyAllocatesItsEntriesOnly checks that what the
// broker does for every job it stores — syncTimersLocked: RemoveAll, then
// its events added — allocates the wheel's entries, in one array, and
// nothing else (the job's event list was a new slice each time, and each
// entry an allocation of its own).
func TestSyncTimersOfANewCopyAllocatesItsEntriesOnly(t *testing.T) {
	f := newFixture(t, 16)
	now := f.clock.ms.Load()
	// Both events inside the wheel's horizon (10 minutes).
	j := &storage.Job{ID: storage.NewJobID(storage.NewNodeID(), 3600, 60), Queue: "q", State: storage.StateActive,
		Etime: now + 300_000, QueueTime: now + 60_000}
	if n := len(j.Events()); n != 2 {
		t.Fatalf("the job has %d events, want 2", n)
	}
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	// Another job's events in the same slots, as on a wheel of many
	// events: a slot the RemoveAll empties drops its array, and making it
	// again is not the entries' cost.
	for _, e := range []storage.Event{{Due: now + 300_000, Kind: storage.EventTTL, ID: "neighbour"},
		{Due: now + 60_000, Kind: storage.EventRetry, ID: "neighbour"},
		willQueueCompanion(storage.Event{Due: now + 60_000, Kind: storage.EventRetry, ID: "neighbour"})} {
		f.b.wheel.Add(e)
	}
	a := testing.AllocsPerRun(100, func() {
		f.b.syncTimersLocked(j.ID, j)
		if n := f.b.wheel.RemoveAll(j.ID); n != 2 {
			t.Fatalf("the job's events in the wheel: %d, want 2 (its retry and its TTL)", n)
		}
	})
	if a > 1 {
		t.Fatalf("syncTimersLocked of a job with 2 events: %.0f allocations, want 1 (its wheel entries, one array)", a)
	}
	// A replica's copy: retry, its WILLQUEUE and TTL, three entries in
	// one array (three allocations before, a tenth of a replica's).
	c := *j
	c.Nodes = []string{storage.NewNodeID(), f.b.NodeID()}
	if n := len(c.Events()); n != 2 || !f.b.holdersElsewhere(&c) {
		t.Fatalf("the copy has %d events (want 2) and holders elsewhere %v", n, f.b.holdersElsewhere(&c))
	}
	a = testing.AllocsPerRun(100, func() {
		f.b.syncTimersLocked(c.ID, &c)
		if n := f.b.wheel.RemoveAll(c.ID); n != 3 {
			t.Fatalf("a copy's events in the wheel: %d, want 3 (its retry, its WILLQUEUE and its TTL)", n)
		}
	})
	if a > 1 {
		t.Fatalf("syncTimersLocked of a copy with 3 events: %.0f allocations, want 1 (its wheel entries, one array)", a)
	}
}

// TestWheelAddAll: AddAll of one job's events is Add of each — an event
// held is replaced, one beyond the span refused and its old one removed,
// one overdue fires — and the entries it makes, one array, are unlinked
// like any other.
func TestWheelAddAll(t *testing.T) {
	w := NewWheel(1000)
	w.Add(storage.Event{Due: 3000, Kind: storage.EventTTL, ID: "j"})
	w.Add(storage.Event{Due: 3000, Kind: storage.EventDelay, ID: "j"})
	if n := w.AddAll([]storage.Event{
		{Due: 5000, Kind: storage.EventRetry, ID: "j"},
		{Due: 900, Kind: eventWillQueue, ID: "j"},                  // overdue
		{Due: 9000, Kind: storage.EventTTL, ID: "j"},               // replaces 3000
		{Due: 1000 + WheelSpan, Kind: storage.EventDelay, ID: "j"}, // refused: removes 3000
	}); n != 3 {
		t.Fatalf("AddAll added %d, want 3", n)
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if w.Len() != 3 || w.Holds("j", storage.EventDelay) {
		t.Fatalf("held %d events (want 3), delay held %v", w.Len(), w.Holds("j", storage.EventDelay))
	}
	var fired []storage.Event
	w.Advance(6000, func(e storage.Event) { fired = append(fired, e) })
	if len(fired) != 2 || fired[0].Kind != eventWillQueue || fired[1].Kind != storage.EventRetry || fired[1].Due != 5000 {
		t.Fatalf("fired %+v, want the WILLQUEUE then the retry at 5000", fired)
	}
	if !w.Remove("j", storage.EventTTL) || w.Len() != 0 {
		t.Fatalf("the TTL event was not held alone: %d left", w.Len())
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestWheelEventsOfOneJobCostOneLookup checks that the events of one new
// copy — syncTimersLocked's RemoveAll of an id the wheel does not hold,
// then an Add per event (retry, its WILLQUEUE, ttl) — cost one index
// lookup and the insert of the id: each lookup of a large wheel's index is
// a cache miss, and they all name one id.
func TestWheelEventsOfOneJobCostOneLookup(t *testing.T) {
	w := NewWheel(1000)
	for i := range 100 {
		w.Add(storage.Event{Due: 2000 + int64(i), Kind: storage.EventRetry, ID: fmt.Sprintf("other-%d", i)})
	}
	before := w.indexOps
	w.RemoveAll("new")
	w.Add(storage.Event{Due: 5000, Kind: storage.EventRetry, ID: "new"})
	w.Add(storage.Event{Due: 4000, Kind: eventWillQueue, ID: "new"})
	w.Add(storage.Event{Due: 9000, Kind: storage.EventTTL, ID: "new"})
	if got := w.indexOps - before; got != 2 {
		t.Fatalf("RemoveAll and three Adds of a new id: %d index operations, want 2 (a lookup and the insert)", got)
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	// Another id's operations in between leave the memo true.
	w.Remove("other-3", storage.EventRetry)
	if !w.Holds("new", eventWillQueue) || w.Holds("other-3", storage.EventRetry) || !w.Remove("new", storage.EventRetry) {
		t.Fatal("Holds or Remove wrong after another id's Remove")
	}
	if n := w.RemoveAll("new"); n != 2 || w.Holds("new", storage.EventTTL) || w.Len() != 99 {
		t.Fatalf("RemoveAll removed %d, Len %d", n, w.Len())
	}
	if err := w.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkWheelNewCopy is what a replica's wheel does for every new copy
// (syncTimersLocked): RemoveAll of a new id, then its retry, WILLQUEUE and
// ttl events, on a wheel of 200k events (the index does not fit in cache).
func BenchmarkWheelNewCopy(b *testing.B) {
	const held = 200_000
	w, ids := wheelOfTTLs(held)
	b.ResetTimer()
	for i := range b.N {
		old := ids[i%held]
		w.RemoveAll(old) // keeps the wheel's size
		id := old + "n"
		w.RemoveAll(id)
		w.Add(storage.Event{Due: 1000 + 60_000, Kind: storage.EventRetry, ID: id})
		w.Add(storage.Event{Due: 1000 + 55_000, Kind: eventWillQueue, ID: id})
		w.Add(storage.Event{Due: 1000 + 3_600_000, Kind: storage.EventTTL, ID: id})
		ids[i%held] = id
	}
}

// BenchmarkWheelNewCopyAddAll is BenchmarkWheelNewCopy with the copy's
// events added as syncTimersLocked adds them now: AddAll, one array for
// their entries.
func BenchmarkWheelNewCopyAddAll(b *testing.B) {
	const held = 200_000
	w, ids := wheelOfTTLs(held)
	b.ResetTimer()
	for i := range b.N {
		old := ids[i%held]
		w.RemoveAll(old)
		id := old + "n"
		w.RemoveAll(id)
		w.AddAll([]storage.Event{{Due: 1000 + 60_000, Kind: storage.EventRetry, ID: id},
			{Due: 1000 + 55_000, Kind: eventWillQueue, ID: id},
			{Due: 1000 + 3_600_000, Kind: storage.EventTTL, ID: id}})
		ids[i%held] = id
	}
}

// wheelOfTTLs is a wheel at 1000 holding the TTL events of n jobs, an
// hour on, and their ids.
func wheelOfTTLs(n int) (*Wheel, []string) {
	w := NewWheel(1000)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("D-%08x-%016x-SQ", i*2654435761, i)
		w.Add(storage.Event{Due: 1000 + 3_600_000 + int64(i), Kind: storage.EventTTL, ID: ids[i]})
	}
	return w, ids
}
