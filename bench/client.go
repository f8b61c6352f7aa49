package bench

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"
)

// Command names under which Result.Commands keeps per-command latencies.
const (
	cmdAddJob      = "ADDJOB"
	cmdAddJobDelay = "ADDJOB DELAY" // delayed workload
	cmdGetJob      = "GETJOB NOHANG"
	cmdGetJobBlock = "GETJOB TIMEOUT" // mixed runs, queue found empty
	cmdAckJob      = "ACKJOB"
	cmdLPush       = "LPUSH"
	cmdRPop        = "RPOP"
	cmdBRPop       = "BRPOP" // mixed runs, list found empty
)

// maxErrorKinds bounds the distinct error messages a client keeps.
const maxErrorKinds = 16

// client is one connection and the statistics of the goroutine driving
// it. Only that goroutine touches it until the run ends.
type client struct {
	run  *runner
	conn net.Conn
	w    *Writer
	r    *Reader

	lat        *Histogram            // per operation (job produced or consumed)
	cmds       map[string]*Histogram // per command
	errSamples map[string]int64
	errors     int64
	produced   int64
	consumed   int64
	emptyPolls int64
	ids        []string
}

func newClient(r *runner, conn net.Conn) *client {
	return &client{
		run:        r,
		conn:       conn,
		w:          NewWriter(conn),
		r:          NewReader(conn),
		lat:        NewHistogram(),
		cmds:       make(map[string]*Histogram),
		errSamples: make(map[string]int64),
	}
}

func (c *client) cmd(name string) *Histogram {
	h := c.cmds[name]
	if h == nil {
		h = NewHistogram()
		c.cmds[name] = h
	}
	return h
}

// errorReply counts an error reply from the server.
func (c *client) errorReply(cmd, msg string) {
	c.errors++
	key := cmd + ": -" + msg
	if _, ok := c.errSamples[key]; !ok && len(c.errSamples) >= maxErrorKinds {
		key = "other errors"
	}
	c.errSamples[key]++
}

// send writes the buffered batch and returns the instant it was handed to
// the kernel: the start of every latency in the batch. The connection
// deadline bounds the whole batch (plus extra, for blocking commands).
func (c *client) send(extra time.Duration) (time.Time, error) {
	t0 := time.Now()
	if err := c.conn.SetDeadline(t0.Add(c.run.opts.Timeout + extra)); err != nil {
		return t0, err
	}
	return t0, c.w.Flush()
}

func (c *client) produceLoop() error {
	r := c.run
	p := r.opts.Pipeline
	q := r.opts.Queue
	name := cmdAddJob
	if r.opts.Target == TargetRedis {
		name = cmdLPush
	}
	delayed := r.workload == WorkloadDelayed
	horizon := int64(r.opts.Horizon / time.Second)
	ttl := strconv.FormatInt(horizon+86400, 10)
	if delayed {
		name = cmdAddJobDelay
	}
	h := c.cmd(name)
	for !r.timeUp() {
		k := r.produce.take(p)
		if k == 0 {
			return nil
		}
		for range k {
			if r.opts.Target == TargetRedis {
				c.w.Array(3)
				c.w.BulkString("LPUSH")
				c.w.BulkString(q)
				c.w.Bulk(r.body)
			} else if delayed {
				c.w.Array(8)
				c.w.BulkString("ADDJOB")
				c.w.BulkString(q)
				c.w.Bulk(r.body)
				c.w.BulkString("0")
				c.w.BulkString("DELAY")
				c.w.BulkInt(int(rand.Int64N(horizon)))
				c.w.BulkString("TTL")
				c.w.BulkString(ttl)
			} else {
				c.w.Array(4)
				c.w.BulkString("ADDJOB")
				c.w.BulkString(q)
				c.w.Bulk(r.body)
				c.w.BulkString("0")
			}
		}
		t0, err := c.send(0)
		if err != nil {
			return err
		}
		done := 0
		for range k {
			v, err := c.r.Read()
			d := time.Since(t0)
			if err != nil {
				return err
			}
			h.Record(d)
			switch {
			case v.Kind == KindError:
				c.errorReply(name, v.Str)
				continue
			case r.opts.Target == TargetRedis && v.Kind != KindInt,
				r.opts.Target == TargetDiskque && (v.Kind != KindSimple || len(v.Str) != 40):
				return fmt.Errorf("unexpected reply to %s: %v", name, v)
			}
			c.lat.Record(d)
			done++
		}
		c.produced += int64(done)
		r.progress.Add(int64(done))
	}
	return nil
}

func (c *client) consumeLoop() error {
	if c.run.opts.Target == TargetRedis {
		return c.consumeRedis()
	}
	return c.consumeDiskque()
}

// consumeDiskque: GETJOB NOHANG COUNT k FROM q, then one ACKJOB for the
// ids it returned. A job's latency runs from the GETJOB write to the
// ACKJOB reply.
func (c *client) consumeDiskque() error {
	r := c.run
	q := r.opts.Queue
	poll := r.opts.MixedPoll
	hGet, hAck := c.cmd(cmdGetJob), c.cmd(cmdAckJob)
	block := false
	for !r.timeUp() {
		k := r.consume.take(r.opts.Pipeline)
		if k == 0 {
			return nil
		}
		name, h, extra := cmdGetJob, hGet, time.Duration(0)
		if block {
			name, h, extra = cmdGetJobBlock, c.cmd(cmdGetJobBlock), poll
			c.w.Array(7)
			c.w.BulkString("GETJOB")
			c.w.BulkString("TIMEOUT")
			c.w.BulkInt(int(poll / time.Millisecond))
		} else {
			c.w.Array(6)
			c.w.BulkString("GETJOB")
			c.w.BulkString("NOHANG")
		}
		c.w.BulkString("COUNT")
		c.w.BulkInt(k)
		c.w.BulkString("FROM")
		c.w.BulkString(q)
		t0, err := c.send(extra)
		if err != nil {
			return err
		}
		v, err := c.r.Read()
		if err != nil {
			return err
		}
		h.Record(time.Since(t0))
		if v.Kind == KindError {
			r.consume.giveBack(k)
			c.errorReply(name, v.Str)
			return fmt.Errorf("%s: -%s", name, v.Str)
		}
		if v.Kind != KindArray {
			return fmt.Errorf("unexpected reply to %s: %v", name, v)
		}
		if len(v.Array) == 0 { // *-1 (or an empty array)
			r.consume.giveBack(k)
			c.emptyPolls++
			if r.producersFinished() {
				return nil
			}
			block = true
			continue
		}
		block = false
		if len(v.Array) > k {
			return fmt.Errorf("%s COUNT %d returned %d jobs", name, k, len(v.Array))
		}
		c.ids = c.ids[:0]
		for _, job := range v.Array {
			if job.Kind != KindArray || len(job.Array) < 3 || job.Array[1].Kind != KindBulk || len(job.Array[1].Str) != 40 {
				return fmt.Errorf("unexpected job in %s reply: %v", name, job)
			}
			c.ids = append(c.ids, job.Array[1].Str)
		}
		n := len(c.ids)
		r.consume.giveBack(k - n)

		c.w.Array(n + 1)
		c.w.BulkString("ACKJOB")
		for _, id := range c.ids {
			c.w.BulkString(id)
		}
		t1, err := c.send(0)
		if err != nil {
			return err
		}
		v, err = c.r.Read()
		end := time.Now()
		if err != nil {
			return err
		}
		hAck.Record(end.Sub(t1))
		switch {
		case v.Kind == KindError:
			c.errorReply(cmdAckJob, v.Str)
			continue
		case v.Kind != KindInt:
			return fmt.Errorf("unexpected reply to ACKJOB: %v", v)
		case v.Int != int64(n):
			c.errorReply(cmdAckJob, "acknowledged "+strconv.FormatInt(v.Int, 10)+" of "+strconv.Itoa(n)+" jobs")
		}
		c.lat.RecordN(end.Sub(t0), int64(n))
		c.consumed += int64(n)
		r.progress.Add(int64(n))
	}
	return nil
}

// consumeRedis: k RPOPs pipelined; a job's latency runs from the batch
// write to its RPOP reply.
func (c *client) consumeRedis() error {
	r := c.run
	q := r.opts.Queue
	poll := r.opts.MixedPoll
	hPop := c.cmd(cmdRPop)
	block := false
	for !r.timeUp() {
		want := r.opts.Pipeline
		if block {
			want = 1
		}
		k := r.consume.take(want)
		if k == 0 {
			return nil
		}
		name, h, extra := cmdRPop, hPop, time.Duration(0)
		if block {
			name, h, extra = cmdBRPop, c.cmd(cmdBRPop), poll
			c.w.Command("BRPOP", q, strconv.FormatFloat(poll.Seconds(), 'f', 3, 64))
		} else {
			for range k {
				c.w.Command("RPOP", q)
			}
		}
		t0, err := c.send(extra)
		if err != nil {
			return err
		}
		got := 0
		var failed error
		for range k {
			v, err := c.r.Read()
			d := time.Since(t0)
			if err != nil {
				return err
			}
			h.Record(d)
			switch {
			case v.Kind == KindError:
				c.errorReply(name, v.Str)
				failed = fmt.Errorf("%s: -%s", name, v.Str)
			case v.Null:
			case v.Kind == KindBulk, v.Kind == KindArray && len(v.Array) == 2:
				c.lat.Record(d)
				got++
			default:
				return fmt.Errorf("unexpected reply to %s: %v", name, v)
			}
		}
		r.consume.giveBack(k - got)
		c.consumed += int64(got)
		r.progress.Add(int64(got))
		if failed != nil {
			return failed
		}
		if got < k {
			c.emptyPolls++
			if r.producersFinished() {
				return nil
			}
			block = got == 0
			continue
		}
		block = false
	}
	return nil
}
