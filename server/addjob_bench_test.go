package server

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// newBenchBroker runs a broker over an in-memory store sized like a real
// one (TestingOptions' tiny segments and memtable would make the store's
// rotations, not the server, the cost being measured).
func newBenchBroker(b *testing.B) *queue.Broker {
	opts := storage.TestingOptions()
	opts.FS = vfs.NewMem()
	opts.SegmentSize = 64 << 20
	opts.MemTableSize = 32 << 20
	opts.CacheSize = 32 << 20
	opts.JobCacheSize = 0
	opts.EnsureDefaults()
	st, err := storage.Open("data", opts)
	if err != nil {
		b.Fatal(err)
	}
	broker, err := queue.New(queue.Options{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	go broker.Run()
	b.Cleanup(func() { broker.Close(); st.Close() })
	return broker
}

// The pipelined benchmarks measure the server's RESP path: many clients
// over 127.0.0.1 (8 × GOMAXPROCS), each writing pipelines of 16 commands
// and reading the 16 replies. Run with -cpuprofile to see the server's
// share (parsing, replies, per-command bookkeeping). This file uses no
// other test helper, so that it can be dropped into an older tree to
// compare against.

// BenchmarkADDJOBPipelined: ADDJOBs of 64-byte bodies over an in-memory
// store (mostly the broker's and the store's cost).
func BenchmarkADDJOBPipelined(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 64)
	benchPipelined(b, newBenchBroker(b), "+D-", []byte("ADDJOB"), []byte("bench"), body, []byte("0"))
}

// BenchmarkPINGPipelined: the server's per-command overhead alone.
func BenchmarkPINGPipelined(b *testing.B) {
	benchPipelined(b, newBenchBroker(b), "+PONG", []byte("PING"))
}

// BenchmarkADDJOBPipeline1: ADDJOBs one at a time per client (issue 16's
// add1), where every command pays the server's bookkeeping alone.
func BenchmarkADDJOBPipeline1(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 64)
	benchPipeline(b, 1, newBenchBroker(b), "+D-", []byte("ADDJOB"), []byte("bench"), body, []byte("0"))
}

func benchPipelined(b *testing.B, broker *queue.Broker, reply string, args ...[]byte) {
	benchPipeline(b, 16, broker, reply, args...)
}

func benchPipeline(b *testing.B, pipeline int, broker *queue.Broker, reply string, args ...[]byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := New(Options{})
	s.SetBroker(broker)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	b.Cleanup(func() {
		s.Close()
		<-done
	})
	addr := ln.Addr().String()
	cmd := fmt.Appendf(nil, "*%d\r\n", len(args))
	for _, a := range args {
		cmd = fmt.Appendf(cmd, "$%d\r\n%s\r\n", len(a), a)
	}
	batch := bytes.Repeat(cmd, pipeline)
	b.SetParallelism(8) // 8 × GOMAXPROCS clients
	b.SetBytes(int64(len(cmd)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		send := func(n int) bool {
			if _, err := c.Write(batch[:n*len(cmd)]); err != nil {
				b.Error(err)
				return false
			}
			for range n {
				line, err := r.ReadString('\n')
				if err != nil || !strings.HasPrefix(line, reply) {
					b.Errorf("reply %q: %v", line, err)
					return false
				}
			}
			return true
		}
		n := 0
		for pb.Next() {
			if n++; n == pipeline {
				if !send(n) {
					return
				}
				n = 0
			}
		}
		if n > 0 {
			send(n)
		}
	})
}
