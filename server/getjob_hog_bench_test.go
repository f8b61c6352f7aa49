package server

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

var hogJobs = flag.Int("bench.hogjobs", 200_000, "jobs queued for the hog in BenchmarkGetJobBesideHugeCount")

// BenchmarkGetJobBesideHugeCount measures what one client asking for
// "GETJOB NOHANG COUNT 1000000" does to everybody else: a queue of
// -bench.hogjobs jobs (100-byte bodies) on a real store in b.TempDir(),
// one hog connection sending that GETJOB again and again until the queue
// is empty, and 4 other connections each looping GETJOB NOHANG on a queue
// of its own, filled beforehand with 40,000 jobs (each command of theirs
// takes the broker's lock once: a stall shows in its GETJOB). It reports the others' GETJOB latency (p50, p99,
// p99.9, max) while the hog runs, the hog's longest GETJOB, its largest reply,
// and the server's peak heap (sampled every 5 ms). It uses no other test
// helper, so it can be dropped into an older tree to compare against.
//
//	go test ./server -run '^$' -bench GetJobBesideHugeCount -benchtime 1x
func BenchmarkGetJobBesideHugeCount(b *testing.B) {
	b.Run("alone", func(b *testing.B) { benchGetJobBeside(b, false) })
	b.Run("hog", func(b *testing.B) { benchGetJobBeside(b, true) })
}

// benchGetJobBeside runs the others beside the hog, or (hog false) alone
// for 3 s on the same filled store, as the baseline.
func benchGetJobBeside(b *testing.B, hog bool) {
	const others, otherJobs = 4, 40_000
	for range b.N {
		b.StopTimer()
		dir := b.TempDir()
		opts := storage.Options{CheckpointInterval: -1, VerifyRate: -1}
		opts.EnsureDefaults()
		st, err := storage.Open(filepath.Join(dir, "data"), opts)
		if err != nil {
			b.Fatal(err)
		}
		br, err := queue.New(queue.Options{Store: st})
		if err != nil {
			b.Fatal(err)
		}
		go br.Run()
		body := bytes.Repeat([]byte("x"), 100)
		fill := func(q string, jobs int) {
			for n := 0; n < jobs; {
				batch := make([]queue.AddRequest, min(1024, jobs-n))
				for i := range batch {
					batch[i] = queue.AddRequest{Queue: q, Body: body, TTL: 86400, Retry: 300, Replicate: 1}
				}
				for _, r := range br.AddJobs(batch) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
				n += len(batch)
			}
		}
		fill("big", *hogJobs)
		for k := range others {
			fill(fmt.Sprintf("other%d", k), otherJobs)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		s := New(Options{})
		s.SetBroker(br)
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		addr := ln.Addr().String()
		runtime.GC()

		var stop atomic.Bool
		var peakHeap atomic.Uint64
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			var ms runtime.MemStats
			for !stop.Load() {
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peakHeap.Load() {
					peakHeap.Store(ms.HeapAlloc)
				}
				time.Sleep(5 * time.Millisecond) // a sampling period, not synchronisation
			}
		}()

		var wg sync.WaitGroup
		lat := make([][]time.Duration, others)
		errs := make(chan error, others+1)
		b.StartTimer()
		hogStart := time.Now()
		var hogMax time.Duration
		var hogReplies, hogGot, hogMaxBytes int
		wg.Add(others)
		for k := range others {
			go func() {
				defer wg.Done()
				c, err := net.Dial("tcp", addr)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				r := bufio.NewReader(c)
				q := fmt.Sprintf("other%d", k)
				for !stop.Load() {
					t0 := time.Now()
					fmt.Fprintf(c, "GETJOB NOHANG FROM %s\r\n", q)
					jobs, _, _, err := skipGetJobReply(r)
					lat[k] = append(lat[k], time.Since(t0))
					if err != nil || jobs != 1 {
						errs <- fmt.Errorf("GETJOB: %d jobs (raise otherJobs?), %v", jobs, err)
						return
					}
				}
			}()
		}
		func() {
			if !hog {
				time.Sleep(3 * time.Second) // the others' run, not synchronisation
				return
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				t0 := time.Now()
				if _, err := io.WriteString(c, "GETJOB NOHANG COUNT 1000000 FROM big\r\n"); err != nil {
					errs <- err
					return
				}
				jobs, _, n, err := skipGetJobReply(r)
				if err != nil {
					errs <- err
					return
				}
				hogMax = max(hogMax, time.Since(t0))
				hogMaxBytes = max(hogMaxBytes, n)
				if jobs == 0 {
					return
				}
				hogReplies++
				hogGot += jobs
			}
		}()
		hogTook := time.Since(hogStart)
		stop.Store(true)
		wg.Wait()
		b.StopTimer()
		<-sampled
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		if hog && hogGot != *hogJobs {
			b.Fatalf("the hog got %d jobs of %d", hogGot, *hogJobs)
		}
		all := slices.Concat(lat...)
		slices.Sort(all)
		pct := func(p float64) float64 {
			if len(all) == 0 {
				return 0
			}
			return float64(all[min(int(p*float64(len(all))), len(all)-1)].Microseconds()) / 1000
		}
		b.ReportMetric(pct(0.50), "others-p50-ms")
		b.ReportMetric(pct(0.99), "others-p99-ms")
		b.ReportMetric(pct(0.999), "others-p99.9-ms")
		b.ReportMetric(pct(1), "others-max-ms")
		b.ReportMetric(float64(len(all)), "others-getjobs")
		b.ReportMetric(hogTook.Seconds(), "hog-s")
		b.ReportMetric(float64(hogReplies), "hog-replies")
		b.ReportMetric(float64(hogMax.Milliseconds()), "hog-max-ms")
		b.ReportMetric(float64(hogMaxBytes)/(1<<20), "hog-max-reply-MiB")
		b.ReportMetric(float64(peakHeap.Load())/(1<<20), "peak-heap-MiB")
		s.Close()
		if err := <-served; err != nil {
			b.Fatal(err)
		}
		br.Close()
		st.Close()
	}
}

// skipGetJobReply reads one GETJOB reply (without WITHCOUNTERS) and
// returns how many jobs it held, their ids (only for a reply of one job)
// and its size in bytes.
func skipGetJobReply(r *bufio.Reader) (jobs int, ids []string, size int, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, nil, 0, err
	}
	size += len(line)
	if string(line) == "*-1\r\n" {
		return 0, nil, size, nil
	}
	if line[0] != '*' {
		return 0, nil, size, fmt.Errorf("reply %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return 0, nil, size, err
	}
	for range n {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, nil, size, err
		}
		size += len(line)
		if string(line) != "*3\r\n" {
			return 0, nil, size, fmt.Errorf("job %q", line)
		}
		for f := range 3 {
			line, err := r.ReadSlice('\n')
			if err != nil || line[0] != '$' {
				return 0, nil, size, errors.Join(err, fmt.Errorf("field %q", line))
			}
			size += len(line)
			l, err := strconv.Atoi(string(line[1 : len(line)-2]))
			if err != nil {
				return 0, nil, size, err
			}
			buf := make([]byte, l+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return 0, nil, size, err
			}
			size += len(buf)
			if f == 1 && n == 1 {
				ids = append(ids, string(buf[:l]))
			}
		}
	}
	return n, ids, size, nil
}
