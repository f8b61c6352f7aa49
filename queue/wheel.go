package queue

import (
	"cmp"
	"math"
	"math/bits"
	"slices"

	"github.com/diskque/diskque/storage"
)

const (
	wheelBits   = 6
	wheelSlots  = 1 << wheelBits // slots per level
	wheelLevels = 6

	// WheelSpan is how far ahead of its current time a Wheel holds events:
	// 64^6 ms, about 795 days. Add refuses an event due WheelSpan or more
	// after Now; the loader keeps its horizon inside it.
	WheelSpan int64 = 1 << (wheelBits * wheelLevels)

	// overdueLevel marks an entry held in Wheel.overdue rather than a slot.
	overdueLevel = -1
)

// Wheel is a hierarchical timing wheel of schedule events (storage.Event)
// due before the broker's in-memory horizon. Time is an argument: the wheel
// never reads the clock; its time moves only when Advance is called.
//
// Structure. Resolution is 1 ms. There are six levels of 64 slots; a slot of
// level l spans 64^l ms (one "tick" of that level), so level 0 holds single
// milliseconds and level 5 ticks of about 12 days. An event due d is kept at
// the lowest level l whose tick count from now is below 64,
//
//	diff(l) = d>>(6l) - now>>(6l) in [1, 63]  (level 0: d - now in [1, 63])
//
// in slot (d>>(6l)) & 63. Level 5 also takes diff 64 (the slot of now's own
// tick, which is otherwise empty), so every d with d-now < WheelSpan fits.
// Events due at or before now wait in the overdue list for the next Advance
// (and, after an AdvanceLimit that stopped at its limit, for the next call).
// Each level has a 64-bit occupancy mask and each slot the smallest due ever
// added since it was last empty (slotMin: exact unless its minimum was
// removed, and always inside the slot's tick).
//
// Invariants, between calls:
//   - every slot entry lies in its slot with diff as above, so all entries of
//     one slot share one tick, and no slot holds now's own tick (diff 0);
//   - mask bit s of level l is set iff that slot is non-empty;
//   - overdue[overdueStart:] holds the overdue entries, Due <= now; fired
//     and removed ones leave nil holes (before overdueStart: only holes)
//     until the list drains or is sorted; unless overdueUnsorted, the live
//     entries are in Due order;
//   - index maps a job id to the first of its entries, at most one per kind,
//     chained through next in no particular order; each entry's level, slot
//     and pos say where it sits (slot entries are swap-deleted), and held
//     counts them all.
//   - while memoOK, index[memoID] is memoHead (nil: memoID not held).
//
// The index is keyed by id alone, not (id, kind), because the broker's
// commonest call is RemoveAll of a job it holds nothing for — every new
// copy a replica stores — and on a wheel of MaxTimers events each hash
// lookup is a cache miss: one per RemoveAll, not one per kind ever added.
//
// Advance jumps from one slotMin to the next: the earliest among the levels'
// first occupied slots, found with a rotate and a trailing-zero count per
// level. At each such time t, and at the final now, every slot whose tick
// contains t is emptied and its entries placed again (lower, or into the
// overdue list when due at t), then the overdue list fires. So Advance visits
// only times where an event fires or a slot cascades, never the empty
// milliseconds between: its cost is O(events fired + slots cascaded), and an
// event cascades at most five times, whatever the jump.
//
// Memory: one wheelEntry (about 48 bytes) per event (AddAll's share an
// array: see there) and one map entry per job, the
// fixed mask, slot and slotMin arrays, and the backing arrays of non-empty
// slots; an emptied slot drops its backing array.
//
// A Wheel is not safe for concurrent use: the broker owns it under its lock.
type Wheel struct {
	now   int64
	index map[string]*wheelEntry // job id → its first entry
	held  int                    // entries in index's chains

	// memoID and memoHead remember the last id looked up in or written to
	// index and its first entry (nil: not held), while memoOK. The events of
	// one new copy (RemoveAll, then an Add per kind: syncTimersLocked) all
	// name one id, and on a large wheel every index lookup is a cache miss:
	// with the memo they cost the RemoveAll's lookup and the insert.
	memoID   string
	memoHead *wheelEntry
	memoOK   bool

	mask    [wheelLevels]uint64
	slots   [wheelLevels][wheelSlots][]*wheelEntry
	slotMin [wheelLevels][wheelSlots]int64

	overdue      []*wheelEntry // Due <= now, waiting to fire; nil = fired or removed
	overdueStart int           // overdue[:overdueStart] is all holes: the next to fire is after
	overdueLive  int           // non-nil entries of overdue
	overdueMin   int64         // <= every live overdue Due (a lower bound)
	// overdueMax is the largest Due appended to overdue since it was last
	// sorted or emptied; overdueUnsorted says an entry was appended below
	// it, so the next Advance must sort. Entries a cascade moves overdue
	// come in Due order, so a burst of due events (a mass expiry) fired over
	// many AdvanceLimit calls is never sorted again.
	overdueMax      int64
	overdueUnsorted bool

	advancing bool
	steps     uint64 // times Advance visited (fired or cascaded); for tests
	cascaded  uint64 // entries moved down from levels 1-5; for tests
	indexOps  uint64 // reads, writes and deletes of index; for tests
}

type wheelEntry struct {
	ev    storage.Event
	next  *wheelEntry // the job's next entry (another kind), or nil
	pos   int32       // index in its slot, or in overdue
	level int8        // 0..5, or overdueLevel
	slot  uint8
}

// NewWheel returns an empty wheel whose time is now (Unix milliseconds).
func NewWheel(now int64) *Wheel {
	return &Wheel{now: now, index: make(map[string]*wheelEntry)}
}

// Now returns the wheel's time: the largest now given to Advance (or
// NewWheel). While Advance runs, it is the due time of the events firing, or
// the previous time while events added overdue fire.
func (w *Wheel) Now() int64 { return w.now }

// Len returns the number of events held, overdue ones included.
func (w *Wheel) Len() int { return w.held }

// Add schedules e. Events are identified by (ID, Kind): adding one that is
// already held replaces it. An event due at or before Now fires on the next
// Advance (or, when added from inside fire, later in the same Advance call).
//
// Add returns false and stores nothing if e.Due is WheelSpan or more after
// Now; an event of the same key that was held is then removed, so a stale
// schedule never fires (the new one is only on disk, beyond the horizon).
func (w *Wheel) Add(e storage.Event) bool {
	return w.add(e, nil, 1)
}

// AddAll is Add of each of evs, in order, which are the events of one
// job, and returns how many it holds now. The entries it makes for events
// not held share one array: a replica's new copy has three (retry, its
// WILLQUEUE, TTL), and an allocation each was a tenth of a replica's. An
// entry of the array whose event fired or went stays allocated while
// another of the job's does (at most the job's other kinds, 2 dead entries
// for a live one: bounded like the wheel).
func (w *Wheel) AddAll(evs []storage.Event) int {
	var spare []wheelEntry
	n := 0
	for k, e := range evs {
		if w.add(e, &spare, len(evs)-k) {
			n++
		}
	}
	return n
}

// add is Add; a new entry comes from *spare when spare is not nil, which
// is made with room for left entries when empty.
func (w *Wheel) add(e storage.Event, spare *[]wheelEntry, left int) bool {
	head, en, prev := w.find(e.ID, e.Kind)
	if e.Due > w.now && uint64(e.Due)-uint64(w.now) >= uint64(WheelSpan) {
		if en != nil {
			w.unlink(en)
			w.drop(e.ID, en, prev)
		}
		return false
	}
	if en != nil {
		w.unlink(en)
	} else {
		if spare == nil {
			en = &wheelEntry{}
		} else {
			if len(*spare) == 0 {
				*spare = make([]wheelEntry, left)
			}
			en, *spare = &(*spare)[0], (*spare)[1:]
		}
		if head == nil {
			w.setHead(e.ID, en)
		} else {
			// After the head: no index write.
			en.next, head.next = head.next, en
		}
		w.held++
	}
	en.ev = e
	w.place(en)
	return true
}

// find returns the first entry of job id (nil if none), its entry of kind
// (nil if none) and the entry before that one in the chain (nil if it is
// the first).
func (w *Wheel) find(id string, kind storage.EventKind) (head, en, prev *wheelEntry) {
	head = w.lookup(id)
	for x := head; x != nil; prev, x = x, x.next {
		if x.ev.Kind == kind {
			return head, x, prev
		}
	}
	return head, nil, nil
}

// drop takes en, found by find with prev before it, out of job id's chain
// (not out of its slot: see unlink).
func (w *Wheel) drop(id string, en, prev *wheelEntry) {
	w.held--
	switch {
	case prev != nil:
		prev.next = en.next
	case en.next != nil:
		w.setHead(id, en.next)
	default:
		w.setHead(id, nil)
	}
	en.next = nil
}

// lookup returns the first entry of job id (nil if none): from the memo
// when it names id, else from index (remembered).
func (w *Wheel) lookup(id string) *wheelEntry {
	if w.memoOK && w.memoID == id {
		return w.memoHead
	}
	head := w.index[id]
	w.indexOps++
	w.memoID, w.memoHead, w.memoOK = id, head, true
	return head
}

// setHead makes en (nil: none) the first entry of job id in index, and
// remembers it.
func (w *Wheel) setHead(id string, en *wheelEntry) {
	if en == nil {
		delete(w.index, id)
	} else {
		w.index[id] = en
	}
	w.indexOps++
	w.memoID, w.memoHead, w.memoOK = id, en, true
}

// Holds reports whether the wheel holds an event (id, kind).
func (w *Wheel) Holds(id string, kind storage.EventKind) bool {
	_, en, _ := w.find(id, kind)
	return en != nil
}

// Events calls f with every event held, in no particular order, until f
// returns false. f must not add or remove events (Holds is fine).
func (w *Wheel) Events(f func(storage.Event) bool) {
	for _, head := range w.index {
		for x := head; x != nil; x = x.next {
			if !f(x.ev) {
				return
			}
		}
	}
}

// Remove removes the event (id, kind) and reports whether it was held.
func (w *Wheel) Remove(id string, kind storage.EventKind) bool {
	_, en, prev := w.find(id, kind)
	if en == nil {
		return false
	}
	w.unlink(en)
	w.drop(id, en, prev)
	return true
}

// RemoveAll removes every event of job id (of any kind) and returns how many
// it removed. For an id not held it is one index lookup.
func (w *Wheel) RemoveAll(id string) int {
	head := w.lookup(id)
	if head == nil {
		return 0
	}
	n := 0
	for x := head; x != nil; {
		next := x.next
		w.unlink(x)
		x.next = nil
		x, n = next, n+1
	}
	w.setHead(id, nil)
	w.held -= n
	return n
}

// Next returns a lower bound of the earliest pending due time, and false if
// the wheel is empty. The bound is exact unless the earliest event of a slot
// was removed (then it is that removed event's due, still after Now when
// nothing is overdue). With overdue events it is at most Now: Advance at
// once. The server loop sleeps until Next, then calls Advance.
func (w *Wheel) Next() (int64, bool) {
	if w.overdueLive > 0 {
		return w.overdueMin, true
	}
	return w.nextSlotTime()
}

// Advance moves the wheel's time to now and calls fire for every event due
// at or before it, in non-decreasing Due order (events of one millisecond in
// any order); a fired event is no longer held. Time never moves backwards: a
// now before Now() moves nothing, though events added overdue still fire.
//
// fire may call Add, Remove and RemoveAll (not Advance: that panics). During
// fire, Now() is the firing event's due time (for an event added overdue, the
// time before this call). An event removed before its turn does not fire; one
// added with Due <= now fires later in the same call (if its Due is before
// Now(), with the events due at Now(): necessarily out of Due order).
func (w *Wheel) Advance(now int64, fire func(storage.Event)) {
	w.AdvanceLimit(now, math.MaxInt, fire)
}

// AdvanceLimit is Advance that fires at most limit (>= 1) events. When it
// stops at the limit with events still due at or before now, it returns
// true: those stay held, in order, and Now() stays at the due time of the
// last event fired (at most now), so a later Advance or AdvanceLimit fires
// them first. (With a stale slotMin, true may be a removed event's due: the
// next call then fires nothing.) Otherwise it returns false with Now() at
// now, as Advance does. In between, the wheel is an ordinary wheel at that
// time: Add, Remove and RemoveAll work as ever (an event added due at or
// before Now fires with the rest; one due between Now and now in its turn).
// So a caller can fire a burst in bounded pieces and do other work between
// them. Those left due at or before Now() are overdue: any later Advance
// fires them, whatever its now.
func (w *Wheel) AdvanceLimit(now int64, limit int, fire func(storage.Event)) (more bool) {
	if w.advancing {
		panic("queue: Wheel.Advance called from inside fire")
	}
	w.advancing = true
	defer func() { w.advancing = false }()

	target := max(now, w.now)
	budget := max(limit, 1)
	w.sortOverdue()
	budget -= w.fireOverdue(fire, budget)
	for {
		t, ok := w.nextSlotTime()
		if budget == 0 && (w.overdueLive > 0 || ok && t <= target) {
			return true
		}
		if !ok || t > target {
			break
		}
		w.steps++
		w.moveTo(t)
		budget -= w.fireOverdue(fire, budget)
	}
	if target > w.now {
		w.moveTo(target) // cascades only: nothing is due by target any more
	}
	return false
}

// place puts en (not linked anywhere) where its due belongs relative to now.
func (w *Wheel) place(en *wheelEntry) {
	d := en.ev.Due
	if d <= w.now {
		en.level, en.slot, en.pos = overdueLevel, 0, int32(len(w.overdue))
		switch {
		case len(w.overdue) == w.overdueStart:
			w.overdueMax = d
		case d < w.overdueMax:
			w.overdueUnsorted = true
		default:
			w.overdueMax = d
		}
		w.overdue = append(w.overdue, en)
		if w.overdueLive == 0 || d < w.overdueMin {
			w.overdueMin = d
		}
		w.overdueLive++
		return
	}
	l := 0
	for l < wheelLevels-1 && d>>(wheelBits*l)-w.now>>(wheelBits*l) >= wheelSlots {
		l++
	}
	s := uint8(d>>(wheelBits*l)) & (wheelSlots - 1)
	list := w.slots[l][s]
	if len(list) == 0 {
		w.mask[l] |= 1 << s
		w.slotMin[l][s] = d
	} else if d < w.slotMin[l][s] {
		w.slotMin[l][s] = d
	}
	en.level, en.slot, en.pos = int8(l), s, int32(len(list))
	w.slots[l][s] = append(list, en)
}

// unlink takes en out of its slot or the overdue list (not out of index:
// see drop).
func (w *Wheel) unlink(en *wheelEntry) {
	if en.level == overdueLevel {
		w.overdue[en.pos] = nil
		w.overdueLive--
		return
	}
	l, s := en.level, en.slot
	list := w.slots[l][s]
	last := len(list) - 1
	if int(en.pos) != last {
		moved := list[last]
		list[en.pos], moved.pos = moved, en.pos
	}
	list[last] = nil
	if last == 0 {
		w.slots[l][s] = nil
		w.mask[l] &^= 1 << s
	} else {
		w.slots[l][s] = list[:last]
	}
}

// firstSlot returns level l's occupied slot whose tick comes first after
// now's own tick.
func (w *Wheel) firstSlot(l int) (uint, bool) {
	m := w.mask[l]
	if m == 0 {
		return 0, false
	}
	c := uint(w.now>>(wheelBits*l)) & (wheelSlots - 1)
	k := uint(bits.TrailingZeros64(bits.RotateLeft64(m, -int(c+1))))
	return (c + 1 + k) & (wheelSlots - 1), true
}

// nextSlotTime returns the earliest slotMin over the levels: the next time at
// which an event fires or a slot's tick begins to hold an event.
func (w *Wheel) nextSlotTime() (int64, bool) {
	best, ok := int64(0), false
	for l := range wheelLevels {
		if s, occupied := w.firstSlot(l); occupied {
			if t := w.slotMin[l][s]; !ok || t < best {
				best, ok = t, true
			}
		}
	}
	return best, ok
}

// moveTo sets now to t (> now, and no later than any slotMin) and cascades,
// top level first, every slot whose tick now contains t. Entries due at t end
// in the overdue list.
func (w *Wheel) moveTo(t int64) {
	w.now = t
	for l := wheelLevels - 1; l >= 0; l-- {
		shift := wheelBits * l
		s := uint8(t>>shift) & (wheelSlots - 1)
		if w.mask[l]&(1<<s) == 0 || w.slotMin[l][s]>>shift != t>>shift {
			continue // empty, or (level 5) 64 ticks ahead: not due to move
		}
		list := w.slots[l][s]
		w.slots[l][s] = nil
		w.mask[l] &^= 1 << s
		for _, en := range list {
			w.place(en) // lands below level l: diff(l) is 0 now
		}
		if l > 0 {
			w.cascaded += uint64(len(list))
		}
		clear(list)
	}
}

// sortOverdue drops the nil holes of the overdue list and sorts it by due, so
// events added overdue between Advance calls fire in order. A list already
// in order is left as it is: sorting it again at every AdvanceLimit of a
// burst would cost O(burst) each time.
func (w *Wheel) sortOverdue() {
	if !w.overdueUnsorted {
		return
	}
	live := w.overdue[:0]
	for _, en := range w.overdue[w.overdueStart:] {
		if en != nil {
			live = append(live, en)
		}
	}
	clear(w.overdue[len(live):])
	slices.SortFunc(live, func(a, b *wheelEntry) int { return cmp.Compare(a.ev.Due, b.ev.Due) })
	for i, en := range live {
		en.pos = int32(i)
	}
	w.overdue, w.overdueStart, w.overdueUnsorted = live, 0, false
	w.overdueMax = 0
	if len(live) > 0 {
		w.overdueMax = live[len(live)-1].ev.Due
	}
}

// fireOverdue fires the overdue list front to back, including entries that
// fire appends to it, until it is empty (then it drops it) or budget events
// have fired. It returns how many fired.
func (w *Wheel) fireOverdue(fire func(storage.Event), budget int) int {
	fired := 0
	for w.overdueStart < len(w.overdue) {
		if fired == budget {
			return fired
		}
		en := w.overdue[w.overdueStart]
		w.overdueStart++
		if en == nil {
			continue
		}
		w.overdue[en.pos] = nil
		w.overdueLive--
		_, _, prev := w.find(en.ev.ID, en.ev.Kind)
		w.drop(en.ev.ID, en, prev)
		fired++
		fire(en.ev)
	}
	if cap(w.overdue) > 1024 {
		w.overdue = nil // do not keep a burst's array
	} else {
		w.overdue = w.overdue[:0]
	}
	w.overdueStart, w.overdueMax, w.overdueUnsorted = 0, 0, false
	return fired
}
