package replication

import (
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/diskque/diskque/storage"
)

// GLOBALQLEN (a command Disque gained after 1.0, from a contributor's
// pull request: its suite's unit 13): a queue's length summed over the
// cluster. The node asked sends QUEUELEN (a request id and the queue's
// name) to every other node that is reachable — neither suspected nor
// failed, leaving ones included, since they still hold queued jobs —
// and whose bus link is up, and waits for their QUEUELENANSWER (the id
// and the queue's QLEN there) until every one answered or the timeout
// passed. A node that does not answer in time (it died a moment ago, its
// link broke, or it is an older build that ignores the message type) is
// left out of the sum: the reply is then the sum of those that answered,
// and PeersQueueLen says how many did. Nothing waits under a lock: the
// ask is registered under Jobs.mu, the messages are sent and awaited
// without it.
//
// A QUEUELEN is answered on the asker's link goroutine from the store's
// counter (queue.Broker.QueueLen: a map read under Store.mu, no Broker.mu,
// no disk read), one small message per request, so a peer that floods
// requests costs one answer each on its own link's bounded queue. An answer is taken only for an
// ask still waiting and from a node it asked, once; any other is
// dropped, so a late answer (after the timeout, or for an ask another
// process made before a restart: ids start at random) changes nothing.

// QueueLenResult is what PeersQueueLen gathered.
type QueueLenResult struct {
	Sum      int64 // the queue's length summed over the nodes that answered
	Asked    int   // the nodes asked (reachable, with a link up)
	Answered int   // those that answered in time
}

// qlenTable is the asks waiting for answers, under Jobs.mu.
type qlenTable struct {
	next    uint64
	pending map[uint64]*qlenAsk
}

// qlenAsk is one PeersQueueLen call.
type qlenAsk struct {
	waiting map[string]bool // nodes asked that have not answered
	res     QueueLenResult
	done    chan struct{} // closed once waiting is empty
}

// maxQueueLenAnswer bounds a decoded length: no queue holds 2^40 jobs, and
// the sum over 65,536 nodes then stays far from overflowing an int64.
const maxQueueLenAnswer = 1 << 40

// PeersQueueLen asks every other reachable node with its link up for the
// length of queue there and returns their sum once all answered or
// timeout passed (see above). This node's own length is not included.
// It blocks for at most timeout; call it with no lock held.
func (j *Jobs) PeersQueueLen(name string, timeout time.Duration) QueueLenResult {
	if name == "" || len(name) > storage.MaxQueueNameLen {
		// No node has such a queue (and every node would drop the
		// QUEUELEN as malformed): nothing to ask.
		return QueueLenResult{}
	}
	nodes := j.queueLenNodes()
	if len(nodes) == 0 {
		return QueueLenResult{}
	}
	ask := &qlenAsk{waiting: make(map[string]bool, len(nodes)), done: make(chan struct{})}
	for _, n := range nodes {
		ask.waiting[n] = true
	}
	ask.res.Asked = len(nodes)
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return ask.res
	}
	t := &j.qlens
	if t.pending == nil {
		t.pending = map[uint64]*qlenAsk{}
		t.next = rand.Uint64()
	}
	t.next++
	id := t.next
	t.pending[id] = ask
	j.mu.Unlock()

	payload := encodeQueueLen(id, name)
	for _, n := range nodes {
		j.send(n, MsgQueueLen, payload)
	}
	j.count(func(s *JobsStats) { s.QueueLensSent += int64(len(nodes)) })
	timer := time.NewTimer(timeout)
	select {
	case <-ask.done:
	case <-timer.C:
	case <-j.stop:
	}
	timer.Stop()
	j.mu.Lock()
	delete(t.pending, id)
	res := ask.res
	j.mu.Unlock()
	if res.Answered < res.Asked {
		j.log.Debug("replication: GLOBALQLEN: nodes did not answer in time", "queue", name,
			"asked", res.Asked, "answered", res.Answered, "timeout", timeout)
	}
	return res
}

// queueLenNodes are the nodes a GLOBALQLEN asks: the other nodes neither
// suspected nor failed (leaving ones too) whose bus link is up.
func (j *Jobs) queueLenNodes() []string {
	var ids []string
	for id := range j.peersUp() {
		ids = append(ids, id)
	}
	return ids
}

// handleQueueLen answers a QUEUELEN with this node's length of the queue.
func (j *Jobs) handleQueueLen(from string, p []byte) error {
	id, name, err := decodeQueueLen(p)
	if err != nil {
		return err
	}
	n := j.broker.QueueLen(name)
	j.send(from, MsgQueueLenAnswer, encodeQueueLenAnswer(id, n))
	return nil
}

// handleQueueLenAnswer adds an answer to the ask it is for, if that ask
// is still waiting for this node.
func (j *Jobs) handleQueueLenAnswer(from string, p []byte) error {
	id, n, err := decodeQueueLenAnswer(p)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	ask := j.qlens.pending[id]
	if ask == nil || !ask.waiting[from] {
		return nil // late, duplicated, or from a node not asked
	}
	delete(ask.waiting, from)
	ask.res.Sum += n
	ask.res.Answered++
	j.stats.QueueLenAnswersReceived++
	if len(ask.waiting) == 0 {
		close(ask.done)
	}
	return nil
}

// QUEUELEN's payload: version, request id (uvarint), queue name.
// QUEUELENANSWER's: version, request id, length (uvarint, at most 2^40).

func encodeQueueLen(id uint64, name string) []byte {
	b := make([]byte, 0, 2+binary.MaxVarintLen64+len(name))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, id)
	return appendString(b, name)
}

func decodeQueueLen(p []byte) (uint64, string, error) {
	d := msgDecoder{b: p}
	d.version()
	id := d.uvarint()
	name := d.queueName()
	if err := d.end(); err != nil {
		return 0, "", err
	}
	return id, name, nil
}

func encodeQueueLenAnswer(id uint64, n int64) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, id)
	return binary.AppendUvarint(b, uint64(max(n, 0)))
}

func decodeQueueLenAnswer(p []byte) (uint64, int64, error) {
	d := msgDecoder{b: p}
	d.version()
	id := d.uvarint()
	n := int64(d.bounded(maxQueueLenAnswer))
	if err := d.end(); err != nil {
		return 0, 0, err
	}
	return id, n, nil
}
