package replication

import "errors"

// MsgType is the type of one bus message (Disque's cluster messages; see
// shared/CLUSTER.md "Jobs across nodes"). The values are on the wire: never
// renumber them.
type MsgType uint8

const (
	MsgReplJob   MsgType = 1  // the whole job: store a copy, answer GOTJOB
	MsgGotJob    MsgType = 2  // a copy is durable here
	MsgSetAck    MsgType = 3  // the job is acked: mark it, answer GOTACK
	MsgGotAck    MsgType = 4  // the ack is recorded here (or the job unknown)
	MsgDelJob    MsgType = 5  // delete your copy
	MsgWillQueue MsgType = 6  // I will queue this job in 500 ms
	MsgQueued    MsgType = 7  // I queued this job (counters to bump)
	MsgWorking   MsgType = 8  // a consumer is working on it: postpone requeue
	MsgPause     MsgType = 9  // a queue's pause state
	MsgNeedJobs  MsgType = 10 // federation: send me jobs of this queue
	MsgYourJobs  MsgType = 11 // federation: jobs for you
	MsgEnqueue   MsgType = 12 // external replication: queue the job you got
	// MsgFastDel is FASTACK's DELJOB that wants an answer (GOTACK): 16,
	// not the next free value, so parts adding types in parallel do not
	// take the same one.
	MsgFastDel MsgType = 16
	// GLOBALQLEN (jobs_qlen.go), numbered apart from the protocol's
	// others: the type byte is all an older node needs to ignore them.
	MsgQueueLen       MsgType = 40 // how many jobs of this queue are queued here?
	MsgQueueLenAnswer MsgType = 41 // the answer to one MsgQueueLen
	// The pause book's bound (jobs_pause_forget.go), numbered apart too.
	MsgPauseHave   MsgType = 48 // I hold this version of a queue's broadcast pause state
	MsgPauseForget MsgType = 49 // every node holds it: drop it if it is still yours
)

// Message is one bus message: a type and an opaque payload (codec.go
// encodes each type's fields).
type Message struct {
	Type    MsgType
	Payload []byte
}

// Handler receives the messages of one peer in the order it sent them. It
// is called from the link's reader goroutine: a slow handler slows only
// that peer's link. from is the sender's node id (authenticated when a
// cluster secret is set). The payload is the handler's to keep.
type Handler func(from string, m Message)

// BatchHandler is a Handler that takes, in one call, the messages of one
// peer that its link has read already (one or more, in the order sent):
// a receiver can then apply a run of them as one (consecutive REPLJOBs:
// one store commit and one GOTJOB, jobs_handle.go). A batch is bounded
// (maxBatchMessages, maxBatchBytes past its first message) and never
// waits for more to arrive: it is what was there. The slice and the
// payloads are the handler's to keep.
type BatchHandler func(from string, ms []Message)

// A batch for a BatchHandler holds at most maxBatchMessages messages, and
// takes no further message once its payloads pass maxBatchBytes, so a
// peer's compressed frames cannot make one batch hold more than
// maxBatchBytes plus one frame's MaxFrame.
const (
	maxBatchMessages = 256
	maxBatchBytes    = 1 << 20
)

// Transport carries job messages between nodes: one persistent, ordered,
// framed link per peer, writes batched (CLUSTER.md "Cluster bus"). Two
// implementations pass one test suite (transport_suite_test.go): TCP on the
// bus port, and an in-memory network for in-process clusters.
//
// Delivery is best effort: a message whose link's queue is full is
// refused (Send says so, ErrLinkFull); one for a peer that is down, or
// still queued when the link's connection breaks, is dropped (TCP: when
// the next attempt fails or the connection breaks; memory: at once), and
// none waits longer than a short bound (TCP's DownQueueTimeout, 1 s) for a
// connection: a message is never delivered to a peer's next life, nor
// seconds late (doc.go "What is dropped, and when"). The protocol above
// retries what matters (REPLJOB every 50 ms until enough GOTJOB, SETACK
// with backoff). Messages to one peer that are delivered arrive in order.
type Transport interface {
	// SetPeer tells the transport where node id listens (its bus address);
	// a link to it is dialled (TCP: at once), and redialled with backoff
	// after it breaks. A changed address replaces the link. The node's own
	// id is ignored.
	SetPeer(id, addr string)
	// RemovePeer closes the link to id and drops its queued messages.
	RemovePeer(id string)
	// Send queues m for id without waiting for the network. The payload is
	// not retained after Send returns (it is copied or written out first).
	Send(id string, m Message) error
	// Connected reports whether a link to id is up now (HELLO priorities,
	// CLUSTER NODES' connected|disconnected).
	Connected(id string) bool
	// Stats are the bus counters (INFO cluster).
	Stats() TransportStats
	// Close closes every link; Send fails afterwards.
	Close() error
}

// TransportStats count what the bus carried since start.
type TransportStats struct {
	MessagesSent, MessagesReceived int64
	BytesSent, BytesReceived       int64 // on the wire, after compression
	Dropped                        int64 // messages refused (ErrLinkFull) or dropped from a link's queue
}

var (
	// ErrUnknownPeer: Send to a node SetPeer never named.
	ErrUnknownPeer = errors.New("replication: unknown peer")
	// ErrLinkFull: the link's queue is full (the peer is slow or down).
	ErrLinkFull = errors.New("replication: the link to the peer is full")
	// ErrTransportClosed: the transport was closed.
	ErrTransportClosed = errors.New("replication: transport closed")
)
