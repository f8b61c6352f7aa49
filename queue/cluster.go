package queue

import (
	"errors"
	"time"

	"github.com/diskque/diskque/storage"
)

// Cluster is what the broker asks of the other nodes (package replication
// implements it; loneNode is a node alone). The broker calls it only with
// no lock of its own held — not Broker.mu, not the add combiner — so an
// implementation may block on the network and may call the broker's
// methods for incoming messages (ReplicaAdd, RemoteSetAck, …) from its own
// goroutines. KnownNodes and ReachablePeers must not block: the broker reads
// them while it plans an add.
type Cluster interface {
	// KnownNodes is the number of nodes known, this one included: the
	// default REPLICATE is min(3, KnownNodes()). 1 means a lone node.
	KnownNodes() int
	// ReachablePeers is the number of other nodes a copy can be sent to
	// now: an ADDJOB with REPLICATE n needs n−1 of them at its start.
	ReachablePeers() int
	// Replicate sends each job (in state wait-repl here) to Job.Repl−1
	// other nodes and returns once each is confirmed (GOTJOB from enough
	// nodes) or its deadline passed. A job that timed out after a copy
	// was sent (Nodes longer than this node) the broker then acks here
	// and hands to Acked, whose collection deletes the copies, retried;
	// one sent nowhere it deletes. One call carries every synchronous job of one add
	// batch, so pipelined ADDJOBs share REPLJOB messages. res[i] is job
	// i's outcome.
	Replicate(jobs []Replication) []ReplicationResult
	// ReplicateAsync sends the jobs (wait-repl here: queued once the
	// nodes returned are recorded) to Job.Repl−1
	// other nodes without waiting for them (ADDJOB ASYNC) and returns the
	// nodes each was sent to, this node first.
	ReplicateAsync(jobs []Replication) [][]string
	// Acked tells the cluster that ACKJOB acked these jobs here (dummy
	// acks among them: IsDummyAck): it collects their copies (SETACK,
	// GOTACK, DELJOB) and deletes the job here (Broker.DelJob) once every
	// holder confirmed.
	Acked(jobs []*storage.Job)
	// FastAcked tells the cluster that FASTACK acked these jobs here
	// (placeholders, or jobs acked before) and found the unknown ids (a
	// dummy ack left for an at-least-once one): it deletes their copies
	// on their holders, and for the unknown ids on every node, retried
	// until each answered, then the placeholders here (Broker.DelJob). A
	// job already being collected keeps its collection. Jobs deleted
	// meanwhile (add.go's timed-out jobs) come too: their placeholder is
	// gone already.
	FastAcked(jobs []*storage.Job, unknown []string)
	// WillQueue tells the other holders of these jobs (active here) that
	// this node queues them in WillQueueAdvance (WILLQUEUE): one that has
	// a job queued answers QUEUED, one that has it acked SETACK.
	WillQueue(jobs []*storage.Job)
	// Queued tells the other holders of these jobs that this node queued
	// them — a requeue, NACK, ENQUEUE, or the answer to a WILLQUEUE —
	// with the counter each bumped here (QUEUED). Receivers postpone their
	// own requeue, bump the counter, and keep a copy they have queued
	// only if they win the tie-break (RemoteQueued).
	Queued(jobs []QueuedJob)
	// Working tells the other holders that a consumer is working on these
	// jobs (WORKING): they postpone their requeue and dequeue a copy they
	// have queued.
	Working(jobs []*storage.Job)
	// Paused sends a queue's pause state to every other node (PAUSE …
	// BCAST); they apply it and send it on to nobody. A node unreachable
	// then gets it once it is reachable again, unless a newer broadcast
	// came meanwhile (package replication versions them).
	Paused(queue string, p storage.PauseState)
	// NeedJobs asks other nodes for jobs of queues empty here (NEEDJOBS;
	// federation.go paces them): each request to its Nodes, or with Nodes
	// nil to every reachable node. A node that is leaving the cluster
	// sends none. The jobs arrive through RemoteYourJobs.
	NeedJobs(reqs []NeedJobsRequest)
}

// AsyncPlanner is optional for a Cluster (package replication's has it):
// an ADDJOB ASYNC's nodes are then chosen before the job is stored, so it
// is stored queued (or delayed) with its node list in one commit and its
// copies are sent after (SendAsync), instead of stored in wait-repl,
// replicated (ReplicateAsync) and stored again with its nodes. Its node
// list is known before a consumer can see it, as ACKJOB needs.
type AsyncPlanner interface {
	// AsyncNodes returns, for each count n of need, up to n other nodes
	// a copy can be sent to now, chosen at random: one call for an add
	// round's ASYNC jobs. It must not block (the broker asks it while it
	// plans an add).
	AsyncNodes(need []int) [][]string
	// SendAsync sends each job to the nodes of its Job.Nodes other than
	// this one (REPLJOB without GOTJOB), not waiting for them.
	SendAsync(jobs []Replication)
}

// PlanMarker is optional for an AsyncPlanner (package replication's has
// it): the broker reads PlanMark once per add round, after AsyncNodes and
// before the round's commit — before any other node or client can know
// the ids of the round's jobs — and hands it to SendAsync with each job
// (Replication.Plan), so the planner can tell what it learned before the
// jobs existed from what it learned after. It must not block.
type PlanMarker interface {
	PlanMark() uint64
}

// Bump is the counter a QUEUED message asks its receivers to bump, as the
// sender did on its own copy.
type Bump uint8

const (
	BumpNone       Bump = iota // an answer to WILLQUEUE: no new delivery
	BumpNacks                  // NACK
	BumpDeliveries             // a requeue or ENQUEUE: additional-deliveries
)

// QueuedJob is one job of Cluster.Queued.
type QueuedJob struct {
	Job  *storage.Job
	Bump Bump
}

// WillQueueAdvance is how long before a holder requeues a job it sends
// WILLQUEUE to the other holders (Disque's JOB_WILLQUEUE_ADVANCE).
const WillQueueAdvance = 500 * time.Millisecond

// Replication is one job for Cluster.Replicate or ReplicateAsync.
type Replication struct {
	Job  *storage.Job
	Body []byte
	// Deadline (Unix ms) is when a synchronous replication gives up: the
	// ADDJOB's ms-timeout or the job's expiry, the earlier; 0 = never.
	Deadline int64
	// Plan is, for a job SendAsync sends, what the planner's PlanMark
	// said before the job was stored (0: the planner has none); see
	// PlanMarker.
	Plan uint64
}

// ReplicationResult is the outcome of one synchronous replication.
type ReplicationResult struct {
	// OK: Job.Repl−1 other nodes confirmed a durable copy in time.
	OK bool
	// Nodes are the nodes that may hold a copy (nodes-delivered), this
	// node first: every node a REPLJOB was sent to.
	Nodes []string
}

// ErrReplTimeout: the ADDJOB's ms-timeout (or the job's TTL) passed before
// enough nodes confirmed a copy; the job is deleted here and on the nodes
// it was sent to (an ack collection, when a copy was sent).
var ErrReplTimeout = errors.New("queue: timeout reached before replicating to the requested number of nodes")

// loneNode is the Cluster of a node alone: no peer to send to, so the
// broker never calls Replicate with a job to send (REPLICATE > 1 is
// refused), and an acked job is deleted at once.
type loneNode struct{}

func (loneNode) KnownNodes() int     { return 1 }
func (loneNode) ReachablePeers() int { return 0 }
func (loneNode) Replicate(jobs []Replication) []ReplicationResult {
	return make([]ReplicationResult, len(jobs))
}
func (loneNode) ReplicateAsync(jobs []Replication) [][]string { return make([][]string, len(jobs)) }
func (loneNode) Acked([]*storage.Job)                         {}
func (loneNode) FastAcked([]*storage.Job, []string)           {}
func (loneNode) WillQueue([]*storage.Job)                     {}
func (loneNode) Queued([]QueuedJob)                           {}
func (loneNode) Working([]*storage.Job)                       {}
func (loneNode) Paused(string, storage.PauseState)            {}
func (loneNode) NeedJobs([]NeedJobsRequest)                   {}

// DefaultReplicate is the REPLICATE of an ADDJOB that gave none:
// min(3, nodes known, this one included).
func (b *Broker) DefaultReplicate() int { return min(3, max(b.cluster.KnownNodes(), 1)) }

// DefaultReplicateElsewhere is the REPLICATE of an ADDJOB … QUEUE-RANDOMLY
// that gave none: min(3, the other nodes known), at least 1. Such a job
// keeps no copy here (ExternalQueueRandomly), so the default counts the
// nodes that can hold one: a 3-node cluster's default is 2, not a NOREPL.
func (b *Broker) DefaultReplicateElsewhere() int {
	return max(min(3, b.cluster.KnownNodes()-1), 1)
}

// Clustered reports whether other nodes are known: ACKJOB then keeps an
// acked job until its copies are collected, and an ack of an unknown job
// leaves a dummy ack.
func (b *Broker) Clustered() bool { return b.cluster.KnownNodes() > 1 }
