package server

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

func init() {
	register(
		&command{name: "addjob", arity: -4, run: cmdAddJob},
		&command{name: "getjob", arity: -3, run: cmdGetJob},
		&command{name: "ackjob", arity: -2, run: idCommand((*queue.Broker).Ack)},
		&command{name: "fastack", arity: -2, run: idCommand((*queue.Broker).FastAck)},
		&command{name: "deljob", arity: -2, run: idCommand((*queue.Broker).DelJob)},
		&command{name: "enqueue", arity: -2, run: idCommand((*queue.Broker).Enqueue)},
		&command{name: "dequeue", arity: -2, run: idCommand((*queue.Broker).Dequeue)},
		&command{name: "nack", arity: -2, run: cmdNack},
		&command{name: "working", arity: 2, run: cmdWorking},
		&command{name: "show", arity: 2, run: cmdShow},
	)
}

// parseAddJob parses ADDJOB's arguments. It returns the request, or the
// error reply. prevQueue is the queue of the ADDJOB before it in the batch:
// a pipeline usually feeds one queue, and reusing that string saves an
// allocation per job.
//
// defaultReplicate gives REPLICATE when the command gives none: min(3, the
// nodes known, this one included), so 1 on a lone node (Disque), or with
// elsewhere (QUEUE-RANDOMLY: no copy here) min(3, the other nodes known);
// it is asked only then.
func parseAddJob(args [][]byte, prevQueue string, defaultReplicate func(elsewhere bool) int) (queue.AddRequest, string) {
	r := queue.AddRequest{Queue: prevQueue, Body: args[2], TTL: 86400}
	if string(args[1]) != prevQueue {
		r.Queue = string(args[1])
	}
	timeout, ok := parseInt(args[3])
	if !ok || timeout < 0 {
		return r, "ERR Invalid timeout"
	}
	r.Timeout = timeout
	retry, replicate := int64(-1), int64(0)
	for i := 4; i < len(args); i++ {
		opt := strings.ToLower(string(args[i]))
		if opt == "async" {
			r.Async = true
			continue
		}
		if opt == "queue-randomly" {
			r.External = queue.ExternalQueueRandomly
			continue
		}
		if i+1 >= len(args) {
			return r, errSyntax
		}
		v, ok := parseInt(args[i+1])
		switch opt {
		case "replicate", "delay", "retry", "ttl", "maxlen":
			if !ok {
				return r, errNotInteger
			}
		default:
			return r, errSyntax
		}
		i++
		switch opt {
		case "replicate":
			if v < 1 || v > 65535 {
				return r, "ERR REPLICATE must be between 1 and 65535"
			}
			replicate = v
		case "delay":
			if v < 0 {
				return r, "ERR DELAY must be positive or zero"
			}
			r.Delay = v
		case "retry":
			if v < 0 {
				return r, "ERR RETRY must be positive or zero"
			}
			retry = v
		case "ttl":
			if v <= 0 {
				return r, "ERR TTL must be greater than zero"
			}
			r.TTL = v
		case "maxlen":
			if v <= 0 {
				return r, "ERR MAXLEN must be greater than zero"
			}
			r.MaxLen = v
		}
	}
	if retry < 0 {
		retry = queue.DefaultRetry(r.TTL)
	}
	r.Retry = retry
	r.Replicate = int(replicate)
	if replicate == 0 {
		r.Replicate = max(defaultReplicate(r.External == queue.ExternalQueueRandomly), 1)
	}
	if r.Retry == 0 && r.Replicate > 1 {
		return r, errRetryRepl
	}
	if r.Delay >= r.TTL {
		return r, errDelayTTL
	}
	return r, ""
}

// cmdAddJob adds this ADDJOB and the ADDJOBs that follow it in the
// pipeline as one batch: one commit, replies in order once durable.
func cmdAddJob(s *Server, c *call) {
	argsList := make([][][]byte, 1, 1+len(c.rest))
	argsList[0] = c.args
	for _, next := range c.rest {
		if len(argsList) >= s.opts.MaxPipelineBatch {
			break
		}
		if len(next.Args) == 0 || !is(next.Args[0], "addjob") {
			break
		}
		argsList = append(argsList, next.Args)
	}
	c.consumed = len(argsList) - 1
	replies := make([]string, len(argsList)) // error reply per command, "" if added
	reqs := make([]queue.AddRequest, 0, len(argsList))
	idx := make([]int, 0, len(argsList))
	// Asked of the cluster once per batch, and only for an ADDJOB without
	// REPLICATE (it reads the membership).
	var defaultRepl [2]int // [0] as usual, [1] for QUEUE-RANDOMLY
	defaultReplicate := func(elsewhere bool) int {
		k := 0
		if elsewhere {
			k = 1
		}
		if defaultRepl[k] == 0 {
			if elsewhere {
				defaultRepl[k] = c.broker.DefaultReplicateElsewhere()
			} else {
				defaultRepl[k] = c.broker.DefaultReplicate()
			}
		}
		return defaultRepl[k]
	}
	for i, args := range argsList {
		if len(args) < 4 {
			replies[i] = "ERR wrong number of arguments for 'addjob' command"
			continue
		}
		var prevQueue string
		if len(reqs) > 0 {
			prevQueue = reqs[len(reqs)-1].Queue
		}
		r, errReply := parseAddJob(args, prevQueue, defaultReplicate)
		if errReply != "" {
			replies[i] = errReply
			continue
		}
		// What the server measured (leaving, memory, disk) outranks
		// QUEUE-RANDOMLY: both keep no copy here, and its NOREPL says why.
		r.External = max(r.External, c.external)
		reqs = append(reqs, r)
		idx = append(idx, i)
	}
	ids := make([]string, len(argsList))
	if len(reqs) > 0 {
		for k, res := range c.broker.AddJobs(reqs) {
			if res.Err != nil {
				replies[idx[k]] = errorReply(res.Err)
			} else {
				ids[idx[k]] = res.ID
			}
		}
	}
	for i := range argsList {
		if replies[i] != "" {
			c.conn.WriteError(replies[i])
		} else {
			c.conn.WriteString(ids[i])
		}
	}
}

// parseGetJob parses GETJOB's options up to FROM and the queues after it.
// It returns the request, WITHCOUNTERS, or the error reply.
func parseGetJob(args [][]byte) (queue.GetRequest, bool, string) {
	req := queue.GetRequest{Count: 1}
	withCounters := false
	i := 1
	for ; i < len(args) && !is(args[i], "from"); i++ {
		switch strings.ToLower(string(args[i])) {
		case "nohang":
			req.NoHang = true
		case "withcounters":
			withCounters = true
		case "timeout", "count":
			if i+1 >= len(args) {
				return req, false, errSyntax
			}
			v, ok := parseInt(args[i+1])
			if is(args[i], "timeout") {
				if !ok || v < 0 {
					return req, false, "ERR Invalid TIMEOUT value"
				}
				req.Timeout = time.Duration(v) * time.Millisecond
			} else {
				if !ok || v <= 0 {
					return req, false, "ERR COUNT must be greater than zero"
				}
				req.Count = int(min(v, queue.MaxGetCount)) // more gets no more (queue.MaxGetCount)
			}
			i++
		default:
			return req, false, errSyntax
		}
	}
	if i+1 >= len(args) {
		// No FROM, or no queue after it.
		return req, false, errSyntax
	}
	for _, q := range args[i+1:] {
		req.Queues = append(req.Queues, string(q))
	}
	return req, withCounters, ""
}

func cmdGetJob(s *Server, c *call) {
	req, withCounters, errReply := parseGetJob(c.args)
	if errReply != "" {
		c.conn.WriteError(errReply)
		return
	}
	if !req.NoHang {
		// Only once it blocks (none of this for a GETJOB served at once):
		// replies to earlier pipelined commands go out before the wait,
		// and a client that hangs up while blocked is not served a job.
		req.OnBlock = func(ctx context.Context) (context.Context, func()) {
			if c.client.unflushed {
				flush(c.conn)
				c.client.unflushed = false
			}
			return watchPeer(ctx, c.conn.NetConn())
		}
	}
	req.Leaving = s.leaving() // -LEAVING rather than block (Disque)
	jobs, err := c.broker.GetJobs(s.ctx, req)
	// A wait ended by the client's hang-up or the server's Close is
	// answered with nothing, not an error.
	if err != nil && !errors.Is(err, context.Canceled) && s.ctx.Err() == nil {
		c.conn.WriteError(errorReply(err))
		return
	}
	if len(jobs) == 0 {
		c.conn.WriteRaw([]byte("*-1\r\n"))
		return
	}
	c.conn.WriteArray(len(jobs))
	for _, j := range jobs {
		if withCounters {
			c.conn.WriteArray(7)
		} else {
			c.conn.WriteArray(3)
		}
		c.conn.WriteBulkString(j.Queue)
		c.conn.WriteBulkString(j.ID)
		c.conn.WriteBulk(j.Body)
		c.client.outBytes += int64(len(j.Body))
		if withCounters {
			c.conn.WriteBulkString("nacks")
			c.conn.WriteInt64(int64(j.Nacks))
			c.conn.WriteBulkString("additional-deliveries")
			c.conn.WriteInt64(int64(j.AdditionalDeliveries))
		}
	}
}

// idCommand is a command that takes job ids and replies with how many jobs
// it changed.
func idCommand(fn func(*queue.Broker, []string) (int, error)) func(*Server, *call) {
	return func(s *Server, c *call) {
		ids, ok := jobIDs(c, c.args[1:])
		if !ok {
			return
		}
		n, err := fn(c.broker, ids)
		if err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
		c.conn.WriteInt(n)
	}
}

// cmdNack: NACK id… [DELAY sec] (DELAY is beyond Disque: a backoff).
func cmdNack(s *Server, c *call) {
	args := c.args[1:]
	delay := int64(0)
	if n := len(args); n >= 2 && is(args[n-2], "delay") {
		v, ok := parseInt(args[n-1])
		if !ok || v < 0 {
			c.conn.WriteError("ERR DELAY must be a non-negative integer")
			return
		}
		delay, args = v, args[:n-2]
		if len(args) == 0 {
			c.conn.WriteError("ERR wrong number of arguments for 'nack' command")
			return
		}
	}
	ids, ok := jobIDs(c, args)
	if !ok {
		return
	}
	n, err := c.broker.Nack(ids, delay)
	if err != nil {
		c.conn.WriteError(errorReply(err))
		return
	}
	c.conn.WriteInt(n)
}

func cmdWorking(s *Server, c *call) {
	ids, ok := jobIDs(c, c.args[1:])
	if !ok {
		return
	}
	retry, err := c.broker.Working(ids[0])
	if err != nil {
		c.conn.WriteError(errorReply(err))
		return
	}
	c.conn.WriteInt64(retry)
}

// cmdShow replies with the 30-element SHOW array (SPEC.md), or a null bulk.
func cmdShow(s *Server, c *call) {
	ids, ok := jobIDs(c, c.args[1:])
	if !ok {
		return
	}
	j, body, err := c.broker.Job(ids[0])
	if err == queue.ErrNoJob {
		c.conn.WriteNull()
		return
	}
	if err != nil && j == nil {
		c.conn.WriteError(errorReply(err))
		return
	}
	writeShow(c, j, body, s.nodesConfirmed(j.ID))
}

// writeShow writes the 30-element SHOW array of j (SPEC.md); a nil body is
// written as null.
func writeShow(c *call, j *storage.Job, body []byte, confirmed []string) {
	now := time.Now().UnixMilli()
	c.conn.WriteArray(30)
	field := func(k string) { c.conn.WriteBulkString(k) }
	field("id")
	c.conn.WriteBulkString(j.ID)
	field("queue")
	c.conn.WriteBulkString(j.Queue)
	field("state")
	c.conn.WriteBulkString(j.State.String())
	field("repl")
	c.conn.WriteInt64(int64(j.Repl))
	field("ttl")
	c.conn.WriteInt64(max(j.Etime-now, 0) / 1000)
	field("ctime")
	c.conn.WriteUint64(j.Ctime)
	field("delay")
	c.conn.WriteInt64(int64(j.Delay))
	field("retry")
	c.conn.WriteInt64(int64(j.Retry))
	field("nacks")
	c.conn.WriteInt64(int64(j.Nacks))
	field("additional-deliveries")
	c.conn.WriteInt64(int64(j.AdditionalDeliveries))
	field("nodes-delivered")
	c.conn.WriteArray(len(j.Nodes))
	for _, n := range j.Nodes {
		c.conn.WriteBulkString(n)
	}
	field("nodes-confirmed")
	c.conn.WriteArray(len(confirmed))
	for _, n := range confirmed {
		c.conn.WriteBulkString(n)
	}
	field("next-requeue-within")
	writeWithin(c, j.QueueTime, now, j.State == storage.StateActive || j.State == storage.StateQueued)
	field("next-awake-within")
	writeWithin(c, j.AwakeTime, now, j.Delayed())
	field("body")
	if body == nil {
		c.conn.WriteNull()
	} else {
		c.conn.WriteBulk(body)
		c.client.outBytes += int64(len(body))
	}
}

// writeWithin writes the milliseconds until at, or null when there is no
// such time.
func writeWithin(c *call, at, now int64, ok bool) {
	if at == 0 || !ok {
		c.conn.WriteNull()
		return
	}
	c.conn.WriteInt64(max(at-now, 0))
}
