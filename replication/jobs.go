package replication

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/queue"

	"github.com/diskque/diskque/storage"
)

// Peers is what the job protocol needs of membership; *Membership
// satisfies it (and a static list does in tests).
type Peers interface {
	// Nodes is every known node, this one included.
	Nodes() []NodeInfo
	// Reachable is the other nodes, neither suspected nor failed.
	Reachable() []NodeInfo
}

// JobsConfig configures Jobs.
type JobsConfig struct {
	// ID is this node's id. Required.
	ID string
	// Peers is membership. Required.
	Peers Peers
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock of deadlines and ack-collection retries. Default
	// time.Now. The broker's clock and this one must agree.
	Now func() time.Time
	// ResendInterval is how often a synchronous replication that is short
	// of confirmations sends to one more node and again to the nodes that
	// did not answer. Default 50 ms (Disque's).
	ResendInterval time.Duration
	// AckRetryTick is how often the background loop looks for SETACKs due
	// again (RetryAcks). Default 100 ms; negative: no loop (tests call
	// RetryAcks with their own time).
	AckRetryTick time.Duration
	// RefuseCopies, if set, says why this node takes no copies of other
	// nodes' jobs now ("" = it takes them): the daemon's is leaving, or
	// memory or disk short (Disque drops a REPLJOB when it is leaving or
	// over its memory warning level). A refused REPLJOB gets no GOTJOB,
	// so its sender goes on to another node at its next round.
	RefuseCopies func() string
	// PauseFile is where the broadcast pause states' versions are kept
	// (jobs_pause.go; the daemon's: PausesFileName in the data
	// directory). "" keeps them in memory only.
	PauseFile string
}

// Ack collection's retry: 1 s doubling to 180 s, ± 500 ms (Disque's
// JOB_GC_RETRY_MIN_PERIOD, MAX_PERIOD and its random error).
const (
	ackRetryMin    = time.Second
	ackRetryMax    = 180 * time.Second
	ackRetryJitter = 500 * time.Millisecond
)

// Jobs is Disque's job protocol over a Transport: it implements
// queue.Cluster for the broker (REPLJOB/GOTJOB replication, SETACK/GOTACK/
// DELJOB ack collection, FASTACK's DELJOB) and handles the same messages
// from other nodes through the broker's methods (ReplicaAdd,
// RemoteSetAck, RemoteDelJob). See doc.go "Job protocol".
type Jobs struct {
	cfg JobsConfig
	log *slog.Logger

	// Set by Start, read-only afterwards.
	broker *queue.Broker
	tr     Transport
	// bound is broker, for self, which runs under mu too; boundTr is tr,
	// for send. Both nil until Start: the daemon serves clients a moment
	// before the bus is up, and a Jobs not started replicates nothing.
	bound   atomic.Pointer[queue.Broker]
	boundTr atomic.Pointer[Transport]
	// incMark counts the changes of peerInc: PlanMark reads it.
	incMark atomic.Uint64
	// replRTT is a moving average of the REPLJOB→GOTJOB round trip (ms),
	// which paces the nodes a short replication adds.
	replRTT atomic.Int64
	// rtt is the same round trips' histogram, for their p99
	// (jobs_observe.go).
	rtt rttHistogram

	// mu guards the maps below. It is a leaf: never held across a broker
	// call, a transport Send or a wait.
	mu sync.Mutex
	// repl: the synchronous replications waiting for GOTJOB, by job id.
	repl map[string]*pendingRepl
	// acks: the acked jobs whose copies are being collected, by job id
	// and by next round (ackgc_table.go).
	acks ackTable
	// confirm: per sender, the REPLJOB copies waiting for durability
	// before their GOTJOB (jobs_handle.go); confirmers counts the
	// goroutines running them, which Close waits for.
	// peerInc: per node, the incarnation of its store its last GOTJOB
	// said (storage.Store.ReplicaIncarnation), which a first REPLJOB to
	// it carries (sendRepl); peerIncAt: the incMark value when that
	// incarnation was learned (SendAsync's test); incAsked: when an
	// ASYNC REPLJOB to it last asked for a GOTJOB (asyncHead, Unix ms).
	peerInc    map[string]uint64
	peerIncAt  map[string]uint64
	incAsked   map[string]int64
	confirm    map[string]*gotJobConfirmer
	confirmers sync.WaitGroup
	closed     bool
	stats      JobsStats

	// pauses: the broadcast pause states and their versions
	// (jobs_pause.go); its own lock, never taken under mu.
	pauses pauseBook
	// givers: the NEEDJOBS being answered, per asker (jobs_federation.go).
	givers givers
	// fedFirst: per asker, the incarnation its empty GOTJOB said and the
	// mark it was learned at; fedIncSent: when this node last told each
	// source its own (jobs_federation_first.go).
	fedFirst   map[string]fedMark
	fedIncSent map[string]int64
	// qlens: the GLOBALQLEN asks waiting for answers (jobs_qlen.go).
	qlens qlenTable
	// inboxes: per sender, the batches HandleBatchQueued queued for its
	// handler goroutine (jobs_inbox.go; its own lock, not mu).
	inboxes inboxes
	// gone: the ids of jobs ended here, which a late REPLJOB must not
	// bring back (jobs_gone.go).
	gone goneIDs
	// upPeers: the peers up (reachable and linked) at the last
	// AskReturning; askedAt: when each was last asked on its return
	// (ackgc_return.go).
	upPeers map[string]bool
	askedAt map[string]time.Time

	stop chan struct{}
	done chan struct{}
}

// JobsStats count the job protocol's work (INFO cluster).
type JobsStats struct {
	ReplJobsSent, GotJobsReceived int64
	SetAcksSent, GotAcksReceived  int64
	DelJobsSent                   int64
	// WILLQUEUE, QUEUED, WORKING and PAUSE messages sent.
	WillQueuesSent, QueuedSent, WorkingsSent, PausesSent int64
	// ENQUEUEs of external replication (jobs_external.go), in jobs.
	EnqueuesSent, EnqueuesReceived int64
	BadPayloads                    int64 // messages dropped as malformed
	CopiesRefused                  int64 // REPLJOB copies dropped: RefuseCopies
	// LateCopiesDropped: REPLJOB copies of jobs that ended here already
	// (jobs_gone.go).
	LateCopiesDropped        int64
	PendingAcks, PendingRepl int // now

	// Federation (jobs_federation.go): NEEDJOBS messages sent, and jobs
	// moved by YOURJOBS each way.
	NeedJobsSent, YourJobsSent, YourJobsReceived int64

	// ReturnAsks: SETACK messages sent to a node that came back
	// (AskReturning, ackgc_return.go), counted in SetAcksSent too.
	ReturnAsks int64

	// GLOBALQLEN (jobs_qlen.go): QUEUELEN requests sent, and the answers
	// received that counted (in time, from a node asked, once).
	QueueLensSent, QueueLenAnswersReceived int64
}

// pendingRepl is one job of a Replicate call.
type pendingRepl struct {
	need int      // other nodes that must confirm
	sent []string // nodes sent to, in order; only appended to
	// confirmed: the nodes that answered GOTJOB, in the order they did;
	// capped at need within one array of the Replicate call's, so that
	// a GOTJOB allocates nothing (a map a job was two allocations on the
	// origin); more confirmations than need (a node added late) append
	// past it into an array of their own.
	confirmed []string
	// list is nodeList's last result, still right while it is one longer
	// than sent (sent only grows); read and written under Jobs.mu.
	list []string
	wake chan struct{} // the Replicate call's, buffered 1
	// external: this node keeps no copy (jobs_external.go): need is
	// Repl, and the copies' node list is sent alone.
	external bool
	// start is when the first REPLJOB went (Unix ms), for the round-trip
	// estimate; added when a node was last added.
	start, added int64
}

// ackGC is the collection of one acked job's copies.
type ackGC struct {
	dummy     bool            // a dummy ack: SETACK to every node
	targets   []string        // the other nodes that may hold a copy
	mayhave   int             // SETACK's: the nodes that may hold it, this one included (0: dummy)
	confirmed map[string]bool // targets that answered GOTACK; nil until one did
	// retries is the SETACK rounds sent: 0 for a holder's collection
	// still waiting for its first (heldAcked), which a DELJOB then ends
	// with no message (delJobs).
	retries int
	next    time.Time // when the next round is due
	// fast: a FASTACK's deletion (jobs_fastack.go): its rounds send
	// FASTDEL, answered GOTACK, and it ends with no DELJOB.
	fast bool
	// etime is when the job expires here (Unix ms; 0: unknown): the
	// collection ends then, with no message (expireLocked).
	etime int64
	// id is the job's; index its place in ackTable's heap.
	id    string
	index int
}

// confirm records that target n answered (or was forgotten).
func (gc *ackGC) confirm(n string) {
	if gc.confirmed == nil {
		gc.confirmed = make(map[string]bool, len(gc.targets))
	}
	gc.confirmed[n] = true
}

var (
	_ queue.Cluster      = (*Jobs)(nil)
	_ queue.AsyncPlanner = (*Jobs)(nil)
	_ queue.SyncPlanner  = (*Jobs)(nil)
	_ queue.PlanMarker   = (*Jobs)(nil)
)

// self is this node's id: the broker's once Start bound it (CLUSTER RESET
// HARD changes it there, Broker.SetNodeID), cfg.ID before.
func (j *Jobs) self() string {
	if b := j.bound.Load(); b != nil {
		return b.NodeID()
	}
	return j.cfg.ID
}

// NewJobs returns the job protocol of node cfg.ID. Messages are handled
// (Handle) from Start on; before, they are dropped.
func NewJobs(cfg JobsConfig) (*Jobs, error) {
	if !storage.ValidNodeID(cfg.ID) {
		return nil, errors.New("replication: JobsConfig.ID must be 40 lower-case hex digits")
	}
	if cfg.Peers == nil {
		return nil, errors.New("replication: JobsConfig.Peers is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ResendInterval <= 0 {
		cfg.ResendInterval = 50 * time.Millisecond
	}
	if cfg.AckRetryTick == 0 {
		cfg.AckRetryTick = 100 * time.Millisecond
	}
	j := &Jobs{cfg: cfg, log: cfg.Logger, repl: map[string]*pendingRepl{}, acks: newAckTable(),
		confirm: map[string]*gotJobConfirmer{},
		peerInc: map[string]uint64{}, peerIncAt: map[string]uint64{}, incAsked: map[string]int64{},
		fedFirst: map[string]fedMark{}, fedIncSent: map[string]int64{},
		stop: make(chan struct{}), done: make(chan struct{})}
	j.pauses.file = cfg.PauseFile
	j.loadPauses()
	return j, nil
}

// Start binds the broker and the transport (whose handler is j.Handle),
// resumes the work a restart left — the collection of every acked job on
// disk, and the deletion of jobs left in wait-repl (their ADDJOB never
// answered: a dummy ack each, collected from every node) — and starts the ack-retry loop, even
// when the resume fails (its error is returned).
func (j *Jobs) Start(b *queue.Broker, t Transport) error {
	j.mu.Lock()
	j.broker, j.tr = b, t
	j.mu.Unlock()
	j.bound.Store(b)
	j.boundTr.Store(&t)
	// The loop runs whatever resume finds: Close waits for it, and new
	// acks need it. A resume that fails (the store failed or its index is
	// corrupt, and the node is about to reopen it) leaves the rest to the
	// next Start.
	//
	// A node that knows no other node (a lone node: no peer in its nodes
	// file) has nothing to resume — on a lone node an ACKJOB deletes at
	// once and no job waits for copies — and skips even the read of the
	// resume set (which holds only acked and wait-repl jobs, so a
	// clustered node's restart does not read its backlog either).
	var err error
	if len(j.otherIDs()) > 0 {
		err = j.resume()
	}
	if j.cfg.AckRetryTick > 0 {
		go j.ackLoop()
	} else {
		close(j.done)
	}
	return err
}

// Close stops the ack-retry loop and wakes every waiting Replicate (which
// then fails). It closes neither the transport nor the broker.
func (j *Jobs) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	for _, p := range j.repl {
		wakeUp(p.wake)
	}
	j.mu.Unlock()
	close(j.stop)
	if j.broker != nil {
		<-j.done
	}
	j.closeInboxes()
	j.confirmers.Wait()
	j.givers.running.Wait()
	return nil
}

// RoundTripMillis is the moving average of the REPLJOB→GOTJOB round trip
// (ms; 0 before the first answer).
func (j *Jobs) RoundTripMillis() int64 { return j.replRTT.Load() }

// Stats returns the protocol's counters.
func (j *Jobs) Stats() JobsStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.stats
	s.PendingAcks, s.PendingRepl = j.acks.len(), len(j.repl)
	return s
}

// KnownNodes implements queue.Cluster.
func (j *Jobs) KnownNodes() int {
	if c, ok := j.cfg.Peers.(interface{ NodeCount() int }); ok {
		return max(c.NodeCount(), 1) // Membership: no list built per ADDJOB
	}
	return max(len(j.cfg.Peers.Nodes()), 1)
}

// ReachablePeers implements queue.Cluster.
func (j *Jobs) ReachablePeers() int { return len(j.reachableIDs()) }

func (j *Jobs) reachableIDs() []string {
	if j.boundTr.Load() == nil {
		return nil // not started: no link to any node yet
	}
	var ids []string
	for _, n := range j.cfg.Peers.Reachable() {
		if n.ID != j.self() && !n.Myself && !n.Leaving {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// linkedIDs are the reachable nodes whose bus link is up now: the ones a
// synchronous REPLJOB goes to (Disque's "no link, no party"). A node just restarted
// is reachable before its link is redialled; picked then, its copy would
// wait in the link's queue while the replication, short, added node after
// node — a REPLICATE 5 job reached all 7 nodes of Disque's suite (05). The
// NOREPL check at the start still counts reachable nodes: one whose link
// is down now may be picked at a later round.
func (j *Jobs) linkedIDs() []string {
	tr := j.boundTr.Load()
	if tr == nil {
		return nil
	}
	ids := j.reachableIDs()
	linked := ids[:0]
	for _, id := range ids {
		if (*tr).Connected(id) {
			linked = append(linked, id)
		}
	}
	return linked
}

func (j *Jobs) otherIDs() []string {
	var ids []string
	for _, n := range j.cfg.Peers.Nodes() {
		if n.ID != j.self() && !n.Myself {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

func wakeUp(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (j *Jobs) nowMillis() int64 { return j.cfg.Now().UnixMilli() }

// send sends one message, counting a failure only in the log at debug:
// the protocol retries what matters.
func (j *Jobs) send(to string, typ MsgType, payload []byte) {
	tr := j.boundTr.Load()
	if tr == nil {
		return // not started: reachableIDs found no node to send to
	}
	if err := (*tr).Send(to, Message{Type: typ, Payload: payload}); err != nil {
		j.log.Debug("replication: send", "to", to, "type", typ, "err", err)
	}
}

// Replicate implements queue.Cluster: REPLJOB to Repl−1 reachable nodes
// chosen at random (one message per node for all the call's jobs it gets);
// every ResendInterval while a job is short, one more node, and the
// REPLJOB again to the nodes that have not answered (a node whose link
// came back gets it); at a job's deadline, its copies are deleted on every node it was
// sent to (by the broker, which acks a job sent somewhere and has it
// collected: Acked).
func (j *Jobs) Replicate(jobs []queue.Replication) []queue.ReplicationResult {
	return j.replicate(jobs, false)
}

// replicate is Replicate, or with external ReplicateExternal.
func (j *Jobs) replicate(jobs []queue.Replication, external bool) []queue.ReplicationResult {
	out := make([]queue.ReplicationResult, len(jobs))
	wake := make(chan struct{}, 1)
	prs, short := j.newPendingRepls(jobs, external, j.nowMillis(), wake)
	var reach []string
	if short {
		reach = j.linkedIDs() // the rest at random, as SyncNodes would have
		for _, p := range prs {
			p.sent = append(p.sent, pick(reach, p.sent, p.need-len(p.sent))...)
		}
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return out
	}
	for i, r := range jobs {
		j.repl[r.Job.ID] = prs[i]
	}
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		for i, r := range jobs {
			if j.repl[r.Job.ID] == prs[i] {
				delete(j.repl, r.Job.ID)
			}
		}
		j.mu.Unlock()
	}()
	// The first REPLJOBs of these jobs, to every node they go to: no
	// node has had one before (this is the only Replicate of a job, and
	// its id was known to nobody), which lets a receiver skip its index
	// lookup (sendRepl's first). The resends below are not first.
	j.sendRepl(jobs, prs, nil, func(n string) replHeader { return replHeader{first: j.peerInc[n]} })

	t := time.NewTimer(j.cfg.ResendInterval)
	defer t.Stop()
	left := len(jobs)
	finished := make([]bool, len(jobs))
	for {
		now := j.nowMillis()
		var resend []int
		var dels map[string][]string
		var enq enqueues
		j.mu.Lock()
		closed := j.closed
		for i, r := range jobs {
			if finished[i] {
				continue
			}
			p := prs[i]
			switch {
			case len(p.confirmed) >= p.need:
				finished[i], left = true, left-1
				out[i] = queue.ReplicationResult{OK: true, Nodes: j.nodeList(p)}
				if external {
					enq.add(p, r.Job, now)
				}
			case closed || r.Deadline != 0 && now >= r.Deadline:
				finished[i], left = true, left-1
				out[i] = queue.ReplicationResult{Nodes: j.nodeList(p)}
				if !external {
					// The broker acks the job here and its collection
					// (Acked) deletes the copies sent, retried until each
					// node confirmed: a DELJOB alone may be lost.
					continue
				}
				for _, n := range p.sent {
					if dels == nil {
						dels = map[string][]string{}
					}
					dels[n] = append(dels[n], r.Job.ID)
				}
			default:
				resend = append(resend, i)
			}
		}
		j.mu.Unlock()
		j.sendEnqueues(enq)
		j.sendDelJobs(dels)
		if left == 0 {
			return out
		}
		select {
		case <-wake:
			continue
		case <-t.C:
		}
		t.Reset(j.cfg.ResendInterval)
		// Short: again to those that did not answer, and one more node
		// each once the answers are late: after ResendInterval, or twice
		// the usual round trip if that is longer (Disque adds a node every
		// 50 ms or more, from its clients' cron; on a loaded machine whose
		// round trip passes 50 ms, adding one at every tick would send a
		// REPLICATE 5 job to every node of a cluster of 7).
		reach = j.linkedIDs()
		addAfter := min(max(j.cfg.ResendInterval.Milliseconds(), 2*j.replRTT.Load()), maxAddNodeAfter)
		now = j.nowMillis()
		j.mu.Lock()
		for _, i := range resend {
			p := prs[i]
			if len(p.confirmed) < p.need && now-p.added >= addAfter {
				p.sent = append(p.sent, pick(reach, p.sent, 1)...)
				p.added = now
			}
		}
		j.mu.Unlock()
		sub := make([]queue.Replication, len(resend))
		subp := make([]*pendingRepl, len(resend))
		for k, i := range resend {
			sub[k], subp[k] = jobs[i], prs[i]
		}
		j.sendRepl(sub, subp, nil, func(string) replHeader { return replHeader{} })
	}
}

// newPendingRepls returns the pendingRepls of one Replicate call, each
// with the nodes planned when its job was stored (SyncNodes), and whether
// a job has fewer of them than it needs. One array of pendingRepls and
// one of their sent lists and confirmed lists for the call (each list
// capped at its need: a node added later reallocates it): the origin paid
// about fifteen allocations a job here, each GC work later.
func (j *Jobs) newPendingRepls(jobs []queue.Replication, external bool, now int64, wake chan struct{}) ([]*pendingRepl, bool) {
	self := j.self()
	prs := make([]*pendingRepl, len(jobs))
	slab := make([]pendingRepl, len(jobs))
	total := 0
	for _, r := range jobs {
		total += int(r.Job.Repl)
	}
	sentSlab := make([]string, 0, total)
	confSlab := make([]string, total)
	short := false
	for i, r := range jobs {
		p := &slab[i]
		*p = pendingRepl{need: int(r.Job.Repl) - 1, wake: wake, external: external, start: now, added: now}
		if external {
			p.need++
		}
		if need := max(p.need, 0); len(sentSlab)+need <= cap(sentSlab) {
			p.sent = sentSlab[len(sentSlab) : len(sentSlab) : len(sentSlab)+need]
			sentSlab = sentSlab[:len(sentSlab)+need]
			p.confirmed, confSlab = confSlab[:0:need], confSlab[need:]
		}
		if !external {
			for _, n := range r.Job.Nodes {
				if n != self && len(p.sent) < p.need && !slices.Contains(p.sent, n) {
					p.sent = append(p.sent, n)
				}
			}
			// Stored with this node and the nodes planned (SyncNodes),
			// the job's own list is the copies' (nodeList's), as long as
			// sent does not grow: not one more list a job.
			if nodes := r.Job.Nodes; len(nodes) == len(p.sent)+1 && nodes[0] == self && slices.Equal(nodes[1:], p.sent) {
				p.list = nodes
			}
		}
		short = short || len(p.sent) < p.need
		prs[i] = p
	}
	return prs, short
}

// maxAddNodeAfter bounds the wait before a short replication adds a node,
// however slow the round trips were (ms).
const maxAddNodeAfter = 1000

// pick returns up to n of from, not in except, in random order.
func pick(from, except []string, n int) []string {
	var scratch []string
	return pickAppend(nil, from, except, n, &scratch)
}

// pickAppend appends to dst up to n of from, not in except, in random
// order (a partial Fisher-Yates shuffle: every ordered choice equally
// likely, as a whole shuffle's prefix), using *scratch for the candidates
// so that a planner's round allocates them once, not once a job.
func pickAppend(dst, from, except []string, n int, scratch *[]string) []string {
	cand := (*scratch)[:0]
	for _, id := range from {
		if !slices.Contains(except, id) {
			cand = append(cand, id)
		}
	}
	*scratch = cand
	n = min(n, len(cand))
	for k := range n {
		r := k + rand.IntN(len(cand)-k)
		cand[k], cand[r] = cand[r], cand[k]
	}
	return append(dst, cand[:n]...)
}

// pickEach is a planner's round: for each count, up to that many of from
// chosen at random, each job's list its own (capped: an append to one
// reallocates it) within one array for the round.
func pickEach(from []string, need []int) [][]string {
	out := make([][]string, len(need))
	total := 0
	for _, n := range need {
		total += max(min(n, len(from)), 0)
	}
	slab := make([]string, 0, total)
	scratch := make([]string, 0, len(from))
	for i, n := range need {
		start := len(slab)
		slab = pickAppend(slab, from, nil, n, &scratch)
		out[i] = slab[start:len(slab):len(slab)]
	}
	return out
}

// sendRepl sends each job to the nodes of its pendingRepl that have not
// confirmed it (to all of nodes[i] when prs is nil), one REPLJOB per node,
// whose header head gives (called under j.mu). A header marked first
// says these are the jobs' first REPLJOBs to that node, stamped with the
// incarnation its GOTJOBs last gave, learned before anyone but this node
// knew their ids (a sync job's first send: Replicate; an ASYNC one's:
// asyncHead), so the node can store them without its index lookup
// (storage.Batch.AddReplicaFirst says why that is exact).
func (j *Jobs) sendRepl(jobs []queue.Replication, prs []*pendingRepl, nodes [][]string, head func(n string) replHeader) {
	per := map[string][]replJob{}
	var order []string
	j.mu.Lock()
	for i, r := range jobs {
		var list, targets []string
		if prs != nil {
			list = j.nodeList(prs[i])
			if len(prs[i].confirmed) == 0 {
				targets = prs[i].sent // only read below
			} else {
				for _, n := range prs[i].sent {
					if !slices.Contains(prs[i].confirmed, n) {
						targets = append(targets, n)
					}
				}
			}
		} else {
			list, targets = nodes[i], nodes[i][1:]
		}
		job := r.Job
		if !slices.Equal(job.Nodes, list) {
			jc := *r.Job
			jc.Nodes = list
			job = &jc
		}
		for _, n := range targets {
			if per[n] == nil {
				order = append(order, n)
			}
			per[n] = append(per[n], replJob{Job: job, Body: r.Body})
		}
	}
	heads := make([]replHeader, len(order))
	for k, n := range order {
		heads[k] = head(n)
	}
	j.mu.Unlock()
	for k, n := range order {
		j.send(n, MsgReplJob, encodeReplJobsHeader(heads[k], per[n]))
		j.count(func(s *JobsStats) { s.ReplJobsSent += int64(len(per[n])) })
	}
}

func (j *Jobs) count(f func(*JobsStats)) {
	j.mu.Lock()
	f(&j.stats)
	j.mu.Unlock()
}

// ReplicateAsync implements queue.Cluster: REPLJOB without GOTJOB to
// Repl−1 reachable nodes chosen at random.
func (j *Jobs) ReplicateAsync(jobs []queue.Replication) [][]string {
	reach := j.reachableIDs() // as AsyncNodes: see there
	nodes := make([][]string, len(jobs))
	for i, r := range jobs {
		nodes[i] = append([]string{j.self()}, pick(reach, nil, int(r.Job.Repl)-1)...)
	}
	j.sendRepl(jobs, nil, nodes, func(string) replHeader { return replHeader{noReply: true} })
	return nodes
}

// SyncNodes implements queue.SyncPlanner: for each count, that many of
// the nodes whose link is up now, chosen at random, as Replicate chooses
// a job's first nodes when none were planned.
func (j *Jobs) SyncNodes(need []int) [][]string {
	return pickEach(j.linkedIDs(), need)
}

// AsyncNodes implements queue.AsyncPlanner: for each count, up to that
// many reachable nodes, chosen at random, as ReplicateAsync chooses them
// (membership read once for all). Unlike a synchronous replication's
// (linkedIDs) they need not have their link up now: nothing waits for
// their answer, and a copy queued on a link being redialled arrives when
// it is up.
func (j *Jobs) AsyncNodes(need []int) [][]string {
	return pickEach(j.reachableIDs(), need)
}

// SendAsync implements queue.AsyncPlanner: the REPLJOB without GOTJOB of
// each job to the nodes of its list but this one, one message per node
// for all the call's jobs it gets.
func (j *Jobs) SendAsync(jobs []queue.Replication) {
	self := j.self()
	nodes := make([][]string, len(jobs))
	for i, r := range jobs {
		if ns := r.Job.Nodes; len(ns) > 0 && ns[0] == self && !slices.Contains(ns[1:], self) {
			// Stored as the broker plans it (this node, then AsyncNodes'):
			// the list itself, not one more a job (only read).
			nodes[i] = ns
			continue
		}
		list := make([]string, 0, len(r.Job.Nodes))
		list = append(list, self)
		for _, n := range r.Job.Nodes {
			if n != self {
				list = append(list, n)
			}
		}
		nodes[i] = list
	}
	j.sendRepl(jobs, nil, nodes, j.asyncHead(jobs))
}

// PlanMark implements queue.PlanMarker: the count of the incarnations
// learned so far (gotJobs), read before an add round's jobs are stored.
func (j *Jobs) PlanMark() uint64 { return j.incMark.Load() }

// asyncIncRefresh is how often, at most, an ASYNC REPLJOB to a node asks
// for a GOTJOB (ms): what teaches an origin whose jobs are all ASYNC the
// node's incarnation, and a new one after the node restarted; while its
// incarnation is unknown, every asyncIncAsk.
const (
	asyncIncRefresh = 1000
	asyncIncAsk     = 50
)

// asyncHead is SendAsync's REPLJOB header to node n (called under j.mu):
// no reply wanted — but every asyncIncRefresh, or while n's incarnation is
// unknown, a GOTJOB, which nothing waits for (gotJobs finds no pending
// replication) but which carries n's incarnation. An ASYNC job's id is
// known to others from the round's commit on (it is queued then: GETJOB,
// NEEDJOBS), before its one REPLJOB to each node goes; so the REPLJOB is
// marked first only with an incarnation learned before that commit: one
// whose incMark is not above the plan mark of every job in the call
// (queue.Replication.Plan, read before the commit).
func (j *Jobs) asyncHead(jobs []queue.Replication) func(n string) replHeader {
	plan := uint64(0)
	for k, r := range jobs {
		if k == 0 || r.Plan < plan {
			plan = r.Plan
		}
	}
	now := j.nowMillis()
	return func(n string) replHeader {
		h := replHeader{noReply: true}
		if inc := j.peerInc[n]; inc != 0 && plan != 0 && j.peerIncAt[n] <= plan {
			h.first = inc
		}
		every := int64(asyncIncRefresh)
		if j.peerInc[n] == 0 {
			every = asyncIncAsk
		}
		if at, ok := j.incAsked[n]; !ok || now-at >= every || now < at {
			h.noReply = false
			j.incAsked[n] = now
		}
		return h
	}
}
