package server

import (
	"cmp"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

func init() {
	register(
		&command{name: "qscan", arity: -1, run: cmdQScan},
		&command{name: "jscan", arity: -1, run: cmdJScan},
	)
}

// Scan cursors are decimal integers below 2^53, as in Disque and Redis SCAN:
// clients parse them as numbers (disqueue-node with JavaScript's parseInt,
// whose numbers hold integers exactly only up to 2^53). "0" starts a scan,
// and a reply's "0" ends it. The server keeps no state per scan: a cursor
// is a position in the scan's order, and the next call goes on from it.
//
// Every item has a position, which only grows along the scan's order. A
// call takes COUNT items from the cursor on, then the rest of the items at
// the last one's position, and replies with the next item's position. So
// consecutive calls cover consecutive ranges of positions, and an item
// present for the whole scan is returned exactly once, whatever is added or
// removed between calls; an item added meanwhile may or may not be.
//
//   - QSCAN walks queue names in the order of a 53-bit FNV-1a hash of the
//     name (then by name), as Disque walks its hash table; the hash is
//     fixed, so a cursor stays valid across restarts.
//   - JSCAN walks job ids in the index's order, and a position is the start
//     of an id: this node's prefix ("D-" and 8 hex digits) and the first 53
//     bits of the id's random part. Ids of another node (which a node never
//     holds: its ids carry its own node id) sort before or after all of
//     this node's and have position 0 or the last one.
//
// A cursor is any decimal number below 2^53, and one we did not issue just
// starts the scan at that position.
const maxCursor = 1<<53 - 1

const (
	errInvalidCursor = "ERR invalid cursor or option name" // Disque's text
	// defaultScanCount is COUNT's default: how many items a call examines.
	defaultScanCount = 10
	// busyLoopPage is how many items a BUSYLOOP examines per step.
	busyLoopPage = 1024
)

// parseCursor parses a cursor: decimal digits, below 2^53.
func parseCursor(arg []byte) (uint64, bool) {
	if len(arg) == 0 || len(arg) > 20 {
		return 0, false
	}
	for _, ch := range arg {
		if ch < '0' || ch > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(string(arg), 10, 64)
	return v, err == nil && v <= maxCursor
}

// queuePos is a queue's position in QSCAN's order.
func queuePos(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64() >> 11
}

// jobIDChars are the characters of a job id's random part (base64), in
// byte order. A JSCAN position is 9 of them after the node's prefix: 8 for
// 6 bits each, and a ninth, one of every second character, for 5.
const jobIDChars = "+/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

const jobPosDigits = 9

// jobPosRadix is the number of values of a position's digit i.
func jobPosRadix(i int) uint64 {
	if i == jobPosDigits-1 {
		return 32
	}
	return 64
}

// jobIDPrefix is the start of every job id this node makes.
func jobIDPrefix(nodeID string) string { return storage.JobIDPrefix(nodeID) }

// jobPosStart is the smallest id string at position pos: ids at pos or
// later are those not less than it.
func jobPosStart(prefix string, pos uint64) string {
	var b [jobPosDigits]byte
	for i := jobPosDigits - 1; i >= 0; i-- {
		r := jobPosRadix(i)
		b[i] = jobIDChars[(pos%r)*(64/r)]
		pos /= r
	}
	return prefix + string(b[:])
}

// jobPos is an id's position in JSCAN's order: the last position whose start
// is not greater than the id (0 for ids before the first).
func jobPos(prefix, id string) uint64 {
	if !strings.HasPrefix(id, prefix) {
		if id < prefix {
			return 0
		}
		return maxCursor
	}
	r := id[len(prefix):]
	var v uint64
	for i := range jobPosDigits {
		radix := jobPosRadix(i)
		rest := uint64(1)
		for k := i + 1; k < jobPosDigits; k++ {
			rest *= jobPosRadix(k)
		}
		if i >= len(r) {
			// A shorter id is before the starts that extend it.
			return max(v*radix*rest, 1) - 1
		}
		// The values of this digit whose character is at most r[i].
		step := 64 / radix
		below, exact := uint64(0), false
		for d := range radix {
			ch := jobIDChars[d*step]
			if ch > r[i] {
				break
			}
			below, exact = d+1, ch == r[i]
		}
		if !exact {
			// Past the last start that agrees so far with digit below-1, or
			// before them all.
			return max((v*radix+below)*rest, 1) - 1
		}
		v = v*radix + below - 1
	}
	return v
}

// jobsFrom is the id after which ScanJobs returns the ids at pos or later:
// just before pos's start among ids of storage.JobIDLen bytes.
func jobsFrom(prefix string, pos uint64) string {
	if pos == 0 {
		return ""
	}
	start := []byte(jobPosStart(prefix, pos))
	start[len(start)-1]-- // a character of jobIDChars, so above 0
	for len(start) < storage.JobIDLen {
		start = append(start, 0xff)
	}
	return string(start)
}

// scanArgs are the options QSCAN and JSCAN share.
type scanArgs struct {
	pos      uint64 // the cursor: 0 starts
	count    int
	busyLoop bool
}

// parseScan parses a scan's cursor and options, which may come in any order
// (disqueue-node sends `QSCAN COUNT 10 0`). option handles the command's own
// options: given an option lower-cased and the arguments after it, it
// returns how many of those it took as values, whether it knows the option,
// and an error reply. It returns the shared arguments or an error reply.
func parseScan(args [][]byte,
	option func(opt string, rest [][]byte) (int, bool, string)) (scanArgs, string) {
	sa := scanArgs{count: defaultScanCount}
	haveCursor := false
	for i := 1; i < len(args); i++ {
		opt := strings.ToLower(string(args[i]))
		switch opt {
		case "busyloop":
			sa.busyLoop = true
			continue
		case "count":
			if i+1 >= len(args) {
				return sa, errSyntax
			}
			v, ok := parseInt(args[i+1])
			if !ok {
				return sa, errNotInteger
			}
			if v <= 0 {
				return sa, "ERR COUNT must be greater than zero"
			}
			sa.count = int(min(v, 1<<20))
			i++
			continue
		}
		n, known, errReply := option(opt, args[i+1:])
		if errReply != "" {
			return sa, errReply
		}
		if known {
			i += n
			continue
		}
		// Neither an option nor a cursor: Disque cannot tell a misspelt
		// option from a bad cursor either.
		pos, ok := parseCursor(args[i])
		if !ok {
			return sa, errInvalidCursor
		}
		if haveCursor {
			return sa, errSyntax
		}
		sa.pos, haveCursor = pos, true
	}
	return sa, ""
}

// intOption parses the value of an option that takes an integer.
func intOption(rest [][]byte, v *int64) (int, bool, string) {
	if len(rest) == 0 {
		return 0, true, errSyntax
	}
	n, ok := parseInt(rest[0])
	if !ok {
		return 0, true, errNotInteger
	}
	*v = n
	return 1, true, ""
}

// writeScanReply writes [cursor, [items…]]: next is the next call's
// position, 0 when the scan is over; item writes each of the n items.
func writeScanReply(c *call, next uint64, n int, item func(i int)) {
	c.conn.WriteArray(2)
	c.conn.WriteBulkString(strconv.FormatUint(next, 10))
	c.conn.WriteArray(n)
	for i := range n {
		item(i)
	}
}

// queueAt is a queue and its position in QSCAN's order.
type queueAt struct {
	pos  uint64
	name string
}

// scanEnd returns how many of n items in position order a call examines —
// count of them, then the rest of those at the last one's position — and
// the next call's position (0: the scan is over).
func scanEnd(n, count int, pos func(i int) uint64) (int, uint64) {
	if n <= count {
		return n, 0
	}
	end := count
	for end < n && pos(end) == pos(end-1) {
		end++
	}
	if end == n {
		return n, 0
	}
	return end, pos(end)
}

// cmdQScan: QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n]
// [IMPORTRATE r]. Each call examines up to COUNT queues in name order and
// replies with those that pass the filters, so a page may be empty before
// the scan ends. BUSYLOOP runs the scan to its end in one reply.
func cmdQScan(s *Server, c *call) {
	minLen, maxLen, importRate := int64(-1), int64(-1), int64(-1)
	haveMin, haveMax, haveRate := false, false, false
	sa, errReply := parseScan(c.args, func(opt string, rest [][]byte) (int, bool, string) {
		switch opt {
		case "minlen":
			haveMin = true
			return intOption(rest, &minLen)
		case "maxlen":
			haveMax = true
			return intOption(rest, &maxLen)
		case "importrate":
			haveRate = true
			return intOption(rest, &importRate)
		}
		return 0, false, ""
	})
	if errReply != "" {
		c.conn.WriteError(errReply)
		return
	}
	// Every queue, in QSCAN's order, from the cursor on.
	var order []queueAt
	for _, name := range c.broker.ScanQueues("", math.MaxInt) {
		if pos := queuePos(name); pos >= sa.pos {
			order = append(order, queueAt{pos, name})
		}
	}
	slices.SortFunc(order, func(a, b queueAt) int {
		return cmp.Or(cmp.Compare(a.pos, b.pos), strings.Compare(a.name, b.name))
	})
	count := sa.count
	if sa.busyLoop {
		count = len(order)
	}
	end, next := scanEnd(len(order), count, func(i int) uint64 { return order[i].pos })
	var names []string
	for _, q := range order[:end] {
		n := c.broker.QueueLen(q.name)
		switch {
		case haveMin && n < minLen, haveMax && n > maxLen:
			continue
		case haveRate && c.broker.ImportRate(q.name) < importRate:
			continue
		}
		names = append(names, q.name)
	}
	writeScanReply(c, next, len(names), func(i int) {
		c.conn.WriteBulkString(names[i])
	})
}

// jobStates is a JSCAN STATE filter: the states asked for, OR-ed; empty
// selects every job.
type jobStates struct {
	states  []storage.State
	delayed bool // beyond Disque: active jobs waiting for their DELAY
}

func (f *jobStates) add(name string) bool {
	switch name {
	case "wait-repl":
		f.states = append(f.states, storage.StateWaitRepl)
	case "active":
		f.states = append(f.states, storage.StateActive)
	case "queued":
		f.states = append(f.states, storage.StateQueued)
	case "acked":
		f.states = append(f.states, storage.StateAcked)
	case "delayed":
		f.delayed = true
	default:
		return false
	}
	return true
}

func (f *jobStates) match(j *storage.Job) bool {
	if len(f.states) == 0 && !f.delayed {
		return true
	}
	for _, st := range f.states {
		if j.State == st {
			return true
		}
	}
	return f.delayed && j.Delayed()
}

// A JSCAN reply lists at most jscanMaxItems jobs, and with REPLY all stops
// before a job that would take its SHOW arrays past jscanMaxBytes (but
// always lists a first job): a call, BUSYLOOP too, that finds more
// returns a cursor to go on from. So one call's memory is bounded, not
// the whole job space's.
const jscanMaxBytes int64 = 4 << 20

var jscanMaxItems = 10_000 // a variable so that tests can lower it

// jscanCost is what a job listed by JSCAN weighs against jscanMaxBytes:
// its id, and with REPLY all its body and the rest of its SHOW array.
func jscanCost(j *storage.Job, replyAll bool) int64 {
	n := int64(len(j.ID)) + 16
	if replyAll {
		n += int64(j.BodySize) + int64(len(j.Queue)) + 48*int64(len(j.Nodes)) + 384
	}
	return n
}

// cmdJScan: JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s]…
// [REPLY id|all]. Each call examines up to COUNT jobs in id order and
// replies with those that pass the filters: their ids, or with REPLY all
// their SHOW arrays; at most jscanMaxItems of them and, with REPLY all,
// about jscanMaxBytes.
func cmdJScan(s *Server, c *call) {
	var states jobStates
	queueName, haveQueue, replyAll := "", false, false
	sa, errReply := parseScan(c.args, func(opt string, rest [][]byte) (int, bool, string) {
		switch opt {
		case "queue", "state", "reply":
		default:
			return 0, false, ""
		}
		if len(rest) == 0 {
			return 0, true, errSyntax
		}
		v := string(rest[0])
		switch opt {
		case "queue":
			queueName, haveQueue = v, true
		case "state":
			if !states.add(strings.ToLower(v)) {
				return 0, true, "ERR unknown job state '" + truncate(oneLine(v), 64) +
					"': use wait-repl, active, queued, acked or delayed"
			}
		case "reply":
			switch strings.ToLower(v) {
			case "id":
				replyAll = false
			case "all":
				replyAll = true
			default:
				return 0, true, "ERR REPLY must be id or all"
			}
		}
		return 1, true, ""
	})
	if errReply != "" {
		c.conn.WriteError(errReply)
		return
	}
	// Pages of at most busyLoopPage jobs, until COUNT jobs were examined
	// and those at the last one's position (BUSYLOOP: the end), or the
	// reply is full (jscanMaxItems, or jscanMaxBytes of REPLY all): then
	// the cursor is the position of the job that did not fit, so the next
	// call starts with it (a job at that position already listed may be
	// listed again: every job is listed at least once). The jobs at the
	// first position examined are all listed, over the limits if need be
	// (ids share a position only by chance, or by forgery), so a call always
	// moves the cursor on.
	prefix := jobIDPrefix(c.broker.NodeID())
	var found []*storage.Job
	var size int64
	after := jobsFrom(prefix, sa.pos)
	examined, first, last, next := 0, uint64(0), uint64(0), uint64(0)
scan:
	for {
		limit := min(sa.count+1, busyLoopPage) // +1: the next call's position
		if sa.busyLoop {
			limit = busyLoopPage
		}
		page, err := c.broker.ScanJobs(after, limit)
		if err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
		for _, j := range page {
			// COUNT jobs, then those at the last one's position.
			pos := jobPos(prefix, j.ID)
			if !sa.busyLoop && examined >= sa.count && pos != last {
				next = pos
				break scan
			}
			if (!haveQueue || j.Queue == queueName) && states.match(j) {
				cost := jscanCost(j, replyAll)
				full := len(found) >= jscanMaxItems || len(found) > 0 && size+cost > jscanMaxBytes
				if full && pos != first {
					next = pos
					break scan
				}
				found = append(found, j)
				size += cost
			}
			if examined == 0 {
				first = pos
			}
			examined, last = examined+1, pos
		}
		if len(page) < limit {
			break
		}
		after = page[len(page)-1].ID
	}
	if !replyAll {
		writeScanReply(c, next, len(found), func(i int) {
			c.conn.WriteBulkString(found[i].ID)
		})
		return
	}
	// Read each job again with its body; one deleted meanwhile is left out.
	type shown struct {
		job  *storage.Job
		body []byte
	}
	items := make([]shown, 0, len(found))
	for _, f := range found {
		j, body, err := c.broker.Job(f.ID)
		if err == queue.ErrNoJob {
			continue
		}
		if err != nil && j == nil {
			c.conn.WriteError(errorReply(err))
			return
		}
		items = append(items, shown{j, body})
	}
	writeScanReply(c, next, len(items), func(i int) {
		writeShow(c, items[i].job, items[i].body, s.nodesConfirmed(items[i].job.ID))
	})
}
