package server

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
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

// Scan cursors. A scan walks its items (queue names, job ids) in order, and
// a cursor names the last item the previous call examined: the next call
// goes on strictly after it. So an item present for the whole scan is
// returned exactly once, whatever is added or removed between calls, and the
// server keeps no state per scan. "0" starts a scan, and a reply's "0" ends
// it. Any other cursor is a kind letter ('q' for QSCAN, 'j' for JSCAN) and
// the unpadded base64url of the item followed by a CRC-32 of kind and item,
// so a cursor we did not issue is refused rather than silently misread.
const (
	cursorQueues = 'q'
	cursorJobs   = 'j'
)

const (
	errInvalidCursor = "ERR invalid cursor"
	// defaultScanCount is COUNT's default: how many items a call examines.
	defaultScanCount = 10
	// busyLoopPage is how many items a BUSYLOOP examines per step.
	busyLoopPage = 1024
)

func encodeCursor(kind byte, item string) string {
	buf := make([]byte, 0, len(item)+4)
	buf = append(buf, item...)
	buf = binary.BigEndian.AppendUint32(buf, cursorSum(kind, item))
	return string(kind) + base64.RawURLEncoding.EncodeToString(buf)
}

// decodeCursor returns the item a cursor names ("" for "0"), or false if it
// is not a cursor of this kind that we issued.
func decodeCursor(kind byte, cursor string) (string, bool) {
	if cursor == "0" {
		return "", true
	}
	if len(cursor) < 2 || cursor[0] != kind {
		return "", false
	}
	buf, err := base64.RawURLEncoding.DecodeString(cursor[1:])
	if err != nil || len(buf) < 5 {
		return "", false
	}
	item := string(buf[:len(buf)-4])
	if binary.BigEndian.Uint32(buf[len(buf)-4:]) != cursorSum(kind, item) {
		return "", false
	}
	return item, true
}

func cursorSum(kind byte, item string) uint32 {
	h := crc32.NewIEEE()
	h.Write([]byte{kind})
	h.Write([]byte(item))
	return h.Sum32()
}

// looksLikeCursor tells a cursor argument from a misspelt option: digits, or
// a kind letter and base64url characters.
func looksLikeCursor(arg []byte) bool {
	if len(arg) == 0 {
		return false
	}
	if _, ok := parseInt(arg); ok {
		return true
	}
	if arg[0] != cursorQueues && arg[0] != cursorJobs {
		return false
	}
	for _, ch := range arg[1:] {
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '-', ch == '_':
		default:
			return false
		}
	}
	return true
}

// scanArgs are the options QSCAN and JSCAN share.
type scanArgs struct {
	after    string // the item the cursor names; "" starts
	count    int
	busyLoop bool
}

// parseScan parses a scan's cursor and options, which may come in any order
// (disqueue-node sends `QSCAN COUNT 10 0`). option handles the command's own
// options: given an option lower-cased and the arguments after it, it
// returns how many of those it took as values, whether it knows the option,
// and an error reply. It returns the shared arguments or an error reply.
func parseScan(args [][]byte, kind byte,
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
		if haveCursor || !looksLikeCursor(args[i]) {
			return sa, errSyntax
		}
		after, ok := decodeCursor(kind, string(args[i]))
		if !ok {
			return sa, errInvalidCursor
		}
		sa.after, haveCursor = after, true
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

// writeScanReply writes [cursor, [items…]]: the cursor names last, or is "0"
// when the scan is over; item writes each of the n items.
func writeScanReply(c *call, kind byte, done bool, last string, n int, item func(i int)) {
	c.conn.WriteArray(2)
	if done {
		c.conn.WriteBulkString("0")
	} else {
		c.conn.WriteBulkString(encodeCursor(kind, last))
	}
	c.conn.WriteArray(n)
	for i := range n {
		item(i)
	}
}

// cmdQScan: QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n]
// [IMPORTRATE r]. Each call examines up to COUNT queues in name order and
// replies with those that pass the filters, so a page may be empty before
// the scan ends. BUSYLOOP runs the scan to its end in one reply.
func cmdQScan(s *Server, c *call) {
	minLen, maxLen, importRate := int64(-1), int64(-1), int64(-1)
	haveMin, haveMax, haveRate := false, false, false
	sa, errReply := parseScan(c.args, cursorQueues, func(opt string, rest [][]byte) (int, bool, string) {
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
	var names []string
	after, done := sa.after, false
	for {
		limit := sa.count
		if sa.busyLoop {
			limit = max(limit, busyLoopPage)
		}
		page := c.broker.ScanQueues(after, limit)
		for _, name := range page {
			n := c.broker.QueueLen(name)
			switch {
			case haveMin && n < minLen, haveMax && n > maxLen:
				continue
			case haveRate && importRate > 0:
				continue // a lone node imports nothing: its rate is 0
			}
			names = append(names, name)
		}
		if len(page) > 0 {
			after = page[len(page)-1]
		}
		if len(page) < limit {
			done = true
		}
		if done || !sa.busyLoop {
			break
		}
	}
	writeScanReply(c, cursorQueues, done, after, len(names), func(i int) {
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
	sa, errReply := parseScan(c.args, cursorJobs, func(opt string, rest [][]byte) (int, bool, string) {
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
	// (BUSYLOOP: the end), or the reply is full (jscanMaxItems, or
	// jscanMaxBytes of REPLY all): then the cursor names the last job
	// examined before the one that did not fit, so the next call goes on
	// with it.
	var found []*storage.Job
	var size int64
	after, done, examined := sa.after, false, 0
scan:
	for sa.busyLoop || examined < sa.count {
		limit := busyLoopPage
		if !sa.busyLoop {
			limit = min(limit, sa.count-examined)
		}
		page, err := c.broker.ScanJobs(after, limit)
		if err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
		for _, j := range page {
			if (!haveQueue || j.Queue == queueName) && states.match(j) {
				cost := jscanCost(j, replyAll)
				if len(found) == jscanMaxItems || len(found) > 0 && size+cost > jscanMaxBytes {
					break scan
				}
				found = append(found, j)
				size += cost
			}
			after = j.ID
			examined++
		}
		if len(page) < limit {
			done = true
			break
		}
	}
	if !replyAll {
		writeScanReply(c, cursorJobs, done, after, len(found), func(i int) {
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
	writeScanReply(c, cursorJobs, done, after, len(items), func(i int) {
		writeShow(c, items[i].job, items[i].body)
	})
}
