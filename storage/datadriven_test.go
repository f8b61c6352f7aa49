package storage

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// TestDataDriven runs the state-machine scripts in testdata/ (regenerate the
// expected output with -rewrite, then read it). Scripts name jobs by alias;
// the harness maps each alias to a fixed, valid job id, so output never shows
// an id. After every command the harness checks doc.go's index invariants
// (a q/ key iff queued, one s/ key per waited-for time and no others, the
// reported counters equal to the index), and fails the test if one is broken.
//
// Commands:
//
//	open [sync=always|everysec|never] [compress=<bytes>]
//	    a new store on a fresh crashable in-memory FS (TestingOptions)
//	add name=<alias>|raw=<id> queue=<q> ctime=<ms> [retry=<s>] [ttl=<s>] [body=<text>]
//	    [repeat=<n>] [random=<n>] [delay-until=<ms>] [qtime=<ms>]
//	    [state=queued|active|wait-repl|acked] [repl=<n>]
//	    ttl 0 means no etime; a body of random=<n> bytes is incompressible
//	queue|deliver|requeue|working name=<alias> [qtime=<ms>]
//	nack name=<alias> [qtime=<ms>] [awake=<ms>]
//	dequeue|ack|delete name=<alias>
//	    job operations also accept raw=<id> instead of name=
//	pause queue=<q> state=none|in|out|all
//	show <alias>...        the job: state, counters, times, its s/ events, body
//	qrange <q> [newest]    QueueRange in pages of 2 (or QueueNewest)
//	qlen <q>
//	queues                 Queues: name, length, pause state
//	due before=<ms>        DueEvents in pages of 2
//	scan                   ScanJobs in pages of 2
//	stats
//	sync | checkpoint
//	restart                Close, then Open on the same FS
//	crash                  CrashClone (only synced data), then Open on it
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if strings.HasPrefix(path, filepath.Join("testdata", "fuzz")) {
			return // go test's fuzz corpus, not a script
		}
		if strings.HasPrefix(path, filepath.Join("testdata", "format5-replicated")) {
			return // a store directory (TestFormat5ReplicatedFixture), not a script
		}
		h := &ddHarness{t: t, ids: map[string]string{}, aliases: map[string]string{}, bodies: map[string][]byte{}}
		defer h.close()
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			before, applied := h.s, wal.LSN(0)
			if before != nil {
				applied = before.Stats().Applied
			}
			out := h.run(td)
			if before != nil && h.s == before && strings.HasPrefix(out, "error:") {
				// A refused operation writes nothing.
				if now := h.s.Stats().Applied; now != applied {
					t.Errorf("%s: %s failed but the applied lsn moved from %d to %d", td.Pos, td.Cmd, applied, now)
				}
			}
			if h.s != nil {
				for _, v := range h.checkInvariants() {
					t.Errorf("%s: %s: invariant violated: %s", td.Pos, td.Cmd, v)
				}
			}
			return out
		})
	})
}

// ddNodePrefix is the creating-node part of every alias's job id.
const ddNodePrefix = "5ca1ab1e"

type ddHarness struct {
	t       *testing.T
	fs      *vfs.MemFS
	opts    Options
	s       *Store
	node    string
	ids     map[string]string // alias → id
	aliases map[string]string // id → alias
	bodies  map[string][]byte // alias → body as added
}

func (h *ddHarness) close() {
	if h.s != nil {
		_ = h.s.Close()
		h.s = nil
	}
}

// id returns the job id of alias: "D-", a fixed node prefix, the alias padded
// with '+' (which sorts before every alias character, so id order is alias
// order), and the TTL digits of the job model.
func (h *ddHarness) id(alias string, ttl, retry int64) string {
	if id, ok := h.ids[alias]; ok {
		return id
	}
	if alias == "" || len(alias) > 24 || strings.Trim(alias, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != "" {
		h.t.Fatalf("bad alias %q: 1 to 24 letters and digits", alias)
	}
	mins := min(max(ttl/60, 0), 65535)
	if retry > 0 {
		mins |= 1
	} else {
		mins &^= 1
	}
	id := fmt.Sprintf("D-%s-%s%s-%04x", ddNodePrefix, alias, strings.Repeat("+", 24-len(alias)), mins)
	if !ValidJobID(id) {
		h.t.Fatalf("made an invalid id %q", id)
	}
	h.ids[alias], h.aliases[id] = id, alias
	return id
}

// alias returns the alias of id (id itself if it has none).
func (h *ddHarness) alias(id string) string {
	if a, ok := h.aliases[id]; ok {
		return a
	}
	return id
}

// errString prints an error with aliases in place of ids.
func (h *ddHarness) errString(err error) string {
	msg := err.Error()
	for id, a := range h.aliases {
		msg = strings.ReplaceAll(msg, id, a)
	}
	return "error: " + msg + "\n"
}

func (h *ddHarness) openStore(td *datadriven.TestData) string {
	s, err := Open("db", h.opts)
	if err != nil {
		h.s = nil
		return h.errString(err)
	}
	h.s = s
	if td == nil {
		return ""
	}
	ri := s.RecoveryInfo()
	node := "same"
	if s.NodeID() != h.node {
		node = "new"
	}
	h.node = s.NodeID()
	return fmt.Sprintf("replayed %d records, node id %s\n", ri.Records, node)
}

func (h *ddHarness) needStore(td *datadriven.TestData) {
	if h.s == nil {
		td.Fatalf(h.t, "no open store")
	}
}

func (h *ddHarness) run(td *datadriven.TestData) string {
	switch td.Cmd {
	case "open":
		h.close()
		h.fs = vfs.NewCrashableMem()
		h.opts = TestingOptions()
		h.opts.FS = h.fs
		h.opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if td.HasArg("sync") {
			var p string
			td.ScanArgs(h.t, "sync", &p)
			if p == "never" {
				p = "no"
			}
			pol, err := wal.ParseSyncPolicy(p)
			if err != nil {
				td.Fatalf(h.t, "%v", err)
			}
			h.opts.Sync = pol
		}
		if td.HasArg("compress") {
			td.ScanArgs(h.t, "compress", &h.opts.CompressThreshold)
		}
		if out := h.openStore(nil); out != "" {
			return out
		}
		h.node = h.s.NodeID()
		return "ok\n"

	case "restart":
		h.needStore(td)
		if err := h.s.Close(); err != nil {
			h.s = nil
			return h.errString(err)
		}
		h.s = nil
		return h.openStore(td)

	case "crash":
		h.needStore(td)
		clone := h.fs.CrashClone(vfs.CrashCloneCfg{})
		// The old store keeps running on the old FS until closed; nothing
		// it does from here on reaches the clone.
		_ = h.s.Close()
		h.s = nil
		h.fs = clone
		h.opts.FS = clone
		return h.openStore(td)

	case "sync":
		h.needStore(td)
		if err := h.s.Sync(); err != nil {
			return h.errString(err)
		}
		return "ok\n"

	case "checkpoint":
		h.needStore(td)
		if err := h.s.Checkpoint(); err != nil {
			return h.errString(err)
		}
		return "ok\n"

	case "add":
		h.needStore(td)
		return h.add(td)

	case "queue", "deliver", "requeue", "nack", "working", "dequeue", "ack", "delete":
		h.needStore(td)
		return h.jobOp(td)

	case "pause":
		h.needStore(td)
		var q, st string
		td.ScanArgs(h.t, "queue", &q)
		td.ScanArgs(h.t, "state", &st)
		p, ok := map[string]PauseState{"none": PauseNone, "in": PauseIn, "out": PauseOut, "all": PauseAll}[st]
		if !ok {
			td.Fatalf(h.t, "bad pause state %q", st)
		}
		if err := h.s.Pause(q, p); err != nil {
			return h.errString(err)
		}
		return fmt.Sprintf("%s: %s\n", q, h.s.PauseState(q))

	case "show":
		h.needStore(td)
		var b strings.Builder
		for _, arg := range td.CmdArgs {
			b.WriteString(h.show(arg.Key))
		}
		return b.String()

	case "qrange":
		h.needStore(td)
		return h.qrange(td)

	case "qlen":
		h.needStore(td)
		if len(td.CmdArgs) != 1 {
			td.Fatalf(h.t, "qlen <queue>")
		}
		return fmt.Sprintf("%d\n", h.s.QueueLen(td.CmdArgs[0].Key))

	case "queues":
		h.needStore(td)
		var b strings.Builder
		for _, qi := range h.s.Queues("", 100) {
			fmt.Fprintf(&b, "%s len=%d pause=%s\n", qi.Name, qi.Len, qi.Pause)
		}
		if b.Len() == 0 {
			return "(none)\n"
		}
		return b.String()

	case "due":
		h.needStore(td)
		var before int64
		td.ScanArgs(h.t, "before", &before)
		var b strings.Builder
		after := Event{}
		for {
			evs, err := h.s.DueEvents(before, after, 2)
			if err != nil {
				return h.errString(err)
			}
			if len(evs) == 0 {
				break
			}
			for _, e := range evs {
				fmt.Fprintf(&b, "%s %d %s\n", e.Kind, e.Due, h.alias(e.ID))
			}
			after = evs[len(evs)-1]
		}
		if b.Len() == 0 {
			return "(none)\n"
		}
		return b.String()

	case "scan":
		h.needStore(td)
		var b strings.Builder
		after, pages := "", 0
		for {
			jobs, err := h.s.ScanJobs(after, 2)
			if err != nil {
				return h.errString(err)
			}
			if len(jobs) == 0 {
				break
			}
			pages++
			for _, j := range jobs {
				if j.ID <= after {
					td.Fatalf(h.t, "scan went back: %s after %s", h.alias(j.ID), h.alias(after))
				}
				after = j.ID
				fmt.Fprintf(&b, "%s %s %s\n", h.alias(j.ID), j.State, j.Queue)
			}
		}
		fmt.Fprintf(&b, "(pages: %d)\n", pages)
		return b.String()

	case "stats":
		h.needStore(td)
		st := h.s.Stats()
		var bodies int64
		for _, seg := range st.Segments {
			bodies += seg.LiveBodies
		}
		return fmt.Sprintf("jobs=%d queues=%d queued=%d live-bodies=%d\n", st.Jobs, st.Queues, st.Queued, bodies)
	}
	td.Fatalf(h.t, "unknown command %q", td.Cmd)
	return ""
}

func (h *ddHarness) add(td *datadriven.TestData) string {
	var name, queue, body, state string
	var ctime, ttl, retry, delayUntil, qtime int64
	var repeat, random, repl int
	ttl, retry, repeat, repl, state = 3600, 60, 1, 1, "queued"
	var id string
	if td.HasArg("raw") {
		td.ScanArgs(h.t, "raw", &id)
	} else {
		td.ScanArgs(h.t, "name", &name)
	}
	td.ScanArgs(h.t, "queue", &queue)
	td.ScanArgs(h.t, "ctime", &ctime)
	td.MaybeScanArgs(h.t, "ttl", &ttl)
	td.MaybeScanArgs(h.t, "retry", &retry)
	td.MaybeScanArgs(h.t, "body", &body)
	td.MaybeScanArgs(h.t, "repeat", &repeat)
	td.MaybeScanArgs(h.t, "random", &random)
	td.MaybeScanArgs(h.t, "delay-until", &delayUntil)
	td.MaybeScanArgs(h.t, "qtime", &qtime)
	td.MaybeScanArgs(h.t, "state", &state)
	td.MaybeScanArgs(h.t, "repl", &repl)
	b := []byte(strings.Repeat(body, repeat))
	if random > 0 {
		rng := rand.New(rand.NewPCG(uint64(len(name)), uint64(random)))
		b = make([]byte, random)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	st, ok := map[string]State{"queued": StateQueued, "active": StateActive, "wait-repl": StateWaitRepl, "acked": StateAcked}[state]
	if !ok {
		td.Fatalf(h.t, "bad state %q", state)
	}
	if id == "" {
		id = h.id(name, ttl, retry)
	}
	j := &Job{
		ID:        id,
		Queue:     queue,
		State:     st,
		Ctime:     uint64(ctime) * 1_000_000,
		Retry:     uint32(retry),
		Repl:      uint16(repl),
		QueueTime: qtime,
	}
	if ttl > 0 {
		j.Etime = ctime + ttl*1000
	}
	if delayUntil != 0 {
		if !td.HasArg("state") {
			j.State = StateActive
		}
		j.AwakeTime = delayUntil
		j.Delay = uint32(max(delayUntil-ctime, 0) / 1000)
	}
	if err := h.s.Add(j, b); err != nil {
		return h.errString(err)
	}
	h.bodies[name] = b
	return h.jobLine(j)
}

func (h *ddHarness) jobOp(td *datadriven.TestData) string {
	var id string
	if td.HasArg("raw") {
		td.ScanArgs(h.t, "raw", &id)
	} else {
		var name string
		td.ScanArgs(h.t, "name", &name)
		id = h.id(name, 3600, 60)
	}
	var qtime, awake int64
	td.MaybeScanArgs(h.t, "qtime", &qtime)
	td.MaybeScanArgs(h.t, "awake", &awake)
	var j *Job
	var err error
	switch td.Cmd {
	case "queue":
		j, err = h.s.Queue(id, qtime)
	case "deliver":
		j, err = h.s.Deliver(id, qtime)
	case "requeue":
		j, err = h.s.Requeue(id, qtime)
	case "nack":
		j, err = h.s.Nack(id, qtime, awake)
	case "working":
		j, err = h.s.Working(id, qtime)
	case "dequeue":
		j, err = h.s.Dequeue(id)
	case "ack":
		j, err = h.s.Ack(id)
	case "delete":
		err = h.s.Delete(id)
	}
	if err != nil {
		return h.errString(err)
	}
	if j == nil {
		return "ok\n"
	}
	return h.jobLine(j)
}

// jobLine is the one-line summary of a job that operations print.
func (h *ddHarness) jobLine(j *Job) string {
	return fmt.Sprintf("%s: %s %s ctime=%s nacks=%d add-deliveries=%d deliveries=%d qtime=%d awake=%d etime=%d\n",
		h.alias(j.ID), j.State, j.Queue, ddCtime(j.Ctime), j.Nacks, j.AdditionalDeliveries, j.Deliveries,
		j.QueueTime, j.AwakeTime, j.Etime)
}

func ddCtime(c uint64) string {
	if c%1_000_000 == 0 {
		return fmt.Sprint(c / 1_000_000)
	}
	return fmt.Sprintf("%d+%d", c/1_000_000, c%1_000_000)
}

func (h *ddHarness) show(alias string) string {
	id := h.id(alias, 3600, 60)
	j, err := h.s.Job(id)
	if err != nil {
		return h.errString(err)
	}
	var evs []string
	for _, e := range h.jobEvents(id) {
		evs = append(evs, fmt.Sprintf("%s@%d", e.Kind, e.Due))
	}
	body, err := h.s.Body(j)
	var bodyStr string
	switch {
	case err != nil:
		bodyStr = h.errString(err)
	case len(body) <= 32 && !bytes.ContainsAny(body, " \n\x00"):
		bodyStr = string(body)
	case bytes.Equal(body, h.bodies[alias]):
		bodyStr = fmt.Sprintf("<%d bytes, as added>", len(body))
	default:
		bodyStr = fmt.Sprintf("<%d bytes, NOT as added>", len(body))
	}
	line := h.jobLine(j)
	return fmt.Sprintf("%s  retry=%d delay=%d events=[%s] size=%d stored=%d body=%s\n",
		line, j.Retry, j.Delay, strings.Join(evs, " "), j.BodySize, j.StoredSize, strings.TrimSuffix(bodyStr, "\n"))
}

func (h *ddHarness) qrange(td *datadriven.TestData) string {
	if len(td.CmdArgs) == 0 {
		td.Fatalf(h.t, "qrange <queue> [newest]")
	}
	q := td.CmdArgs[0].Key
	var pos []QueuePos
	if td.HasArg("newest") {
		var err error
		if pos, err = h.s.QueueNewest(q, 100); err != nil {
			return h.errString(err)
		}
	} else {
		after := QueuePos{}
		for {
			page, err := h.s.QueueRange(q, after, 2)
			if err != nil {
				return h.errString(err)
			}
			if len(page) == 0 {
				break
			}
			pos = append(pos, page...)
			after = page[len(page)-1]
		}
	}
	if len(pos) == 0 {
		return "(empty)\n"
	}
	parts := make([]string, len(pos))
	for i, p := range pos {
		parts[i] = fmt.Sprintf("%s@%s", h.alias(p.ID), ddCtime(p.Ctime))
	}
	return strings.Join(parts, " ") + "\n"
}

// jobEvents returns the s/ keys of one job, read from the index.
func (h *ddHarness) jobEvents(id string) []Event {
	var out []Event
	for _, e := range h.allEvents() {
		if e.ID == id {
			out = append(out, e)
		}
	}
	return out
}

func (h *ddHarness) allEvents() []Event {
	var out []Event
	h.scanKeys(prefixSchedule, func(k, _ []byte) {
		e, err := parseScheduleKey(k)
		if err != nil {
			h.t.Errorf("schedule key %x: %v", k, err)
			return
		}
		out = append(out, e)
	})
	return out
}

// scanKeys calls fn for every index key with the prefix byte, in the index
// as the store reads it (its write buffer over Pebble).
func (h *ddHarness) scanKeys(prefix byte, fn func(k, v []byte)) {
	err := h.s.scanPrefix([]byte{prefix}, func(k, v []byte) error {
		fn(k, v)
		return nil
	})
	if err != nil {
		h.t.Fatalf("scan %c: %v", prefix, err)
	}
}

// checkInvariants compares the index with what doc.go says it must hold for
// the jobs it holds, and the in-memory counters with the index.
func (h *ddHarness) checkInvariants() []string {
	var bad []string
	jobs := map[string]*Job{}
	wantQ := map[string]bool{}
	wantS := map[Event]bool{}
	wantCount := map[string]int64{}
	h.scanKeys(prefixJob, func(k, v []byte) {
		j, err := decodeJob(string(k[1:]), v, h.s.names.Load())
		if err != nil {
			bad = append(bad, fmt.Sprintf("job %x: %v", k, err))
			return
		}
		if string(k[1:]) != j.ID {
			bad = append(bad, fmt.Sprintf("job key %s holds job %s", h.alias(string(k[1:])), h.alias(j.ID)))
		}
		jobs[j.ID] = j
		if j.State == StateQueued {
			wantQ[string(queueKey(j.Queue, j.Ctime, j.ID))] = true
			wantCount[j.Queue]++
			if j.AwakeTime != 0 {
				bad = append(bad, fmt.Sprintf("%s is queued with an awake time", h.alias(j.ID)))
			}
		}
		if j.State == StateAcked && (j.QueueTime != 0 || j.AwakeTime != 0) {
			bad = append(bad, fmt.Sprintf("%s is acked but waits for a requeue or awake", h.alias(j.ID)))
		}
		if j.Retry == 0 && j.QueueTime != 0 {
			bad = append(bad, fmt.Sprintf("%s is at-most-once but has a requeue time", h.alias(j.ID)))
		}
		evs, n := events(j)
		for _, e := range evs[:n] {
			wantS[e] = true
		}
	})
	h.scanKeys(prefixQueue, func(k, _ []byte) {
		if !wantQ[string(k)] {
			_, id, _ := parseQueueKey(k)
			bad = append(bad, fmt.Sprintf("q/ key of %s, which is not a queued job", h.alias(id)))
		}
		delete(wantQ, string(k))
	})
	for k := range wantQ {
		_, id, _ := parseQueueKey([]byte(k))
		bad = append(bad, fmt.Sprintf("queued job %s has no q/ key", h.alias(id)))
	}
	for _, e := range h.allEvents() {
		if !wantS[e] {
			bad = append(bad, fmt.Sprintf("stray s/ key %s@%d of %s", e.Kind, e.Due, h.alias(e.ID)))
		}
		delete(wantS, e)
	}
	for e := range wantS {
		bad = append(bad, fmt.Sprintf("missing s/ key %s@%d of %s", e.Kind, e.Due, h.alias(e.ID)))
	}
	// The counters Stats, QueueLen and Queues report.
	st := h.s.Stats()
	if st.Jobs != int64(len(jobs)) {
		bad = append(bad, fmt.Sprintf("Stats().Jobs %d, %d j/ keys", st.Jobs, len(jobs)))
	}
	var queued int64
	for _, n := range wantCount {
		queued += n
	}
	if st.Queued != queued || st.Queues != len(wantCount) {
		bad = append(bad, fmt.Sprintf("Stats() has %d queued in %d queues, the index %d in %d",
			st.Queued, st.Queues, queued, len(wantCount)))
	}
	gotCount := map[string]int64{}
	for _, qi := range h.s.Queues("", 1<<20) {
		if qi.Len != 0 {
			gotCount[qi.Name] = qi.Len
		}
		if qi.Len != h.s.QueueLen(qi.Name) {
			bad = append(bad, fmt.Sprintf("queue %s: Queues says %d, QueueLen %d", qi.Name, qi.Len, h.s.QueueLen(qi.Name)))
		}
	}
	if !maps.Equal(gotCount, wantCount) {
		bad = append(bad, fmt.Sprintf("queue lengths %v, queued jobs %v", gotCount, wantCount))
	}
	sort.Strings(bad)
	return bad
}
