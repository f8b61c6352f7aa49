// Package bench is diskque's load generator: it drives a diskque (or, as a
// yardstick, a redis) server over its own pipelined RESP2 connections and
// measures throughput and per-operation latency, so users can choose a
// persistence mode (appendonly no, appendfsync no/everysec/always) from
// numbers taken on their own machine. cmd/diskque-bench wires flags to it.
//
// # Runs
//
// A run (Run, Options) opens Clients TCP connections, one goroutine each,
// and stops after Count operations or after Duration, whichever comes
// first. Pipeline depth P means:
//
//	produce            send P × "ADDJOB q body 0" (redis: LPUSH q body), then read P replies
//	consume (diskque)  send "GETJOB NOHANG COUNT P FROM q", then one "ACKJOB id…" for the jobs it got
//	consume (redis)    send P × "RPOP q", then read P replies
//	mixed              half the clients produce, half consume, on the same queue
//	delayed (diskque)  send P × "ADDJOB q body 0 DELAY d TTL t", d uniform in [0, Horizon)
//
// A consumer stops when the queue is empty (GETJOB's *-1, RPOP's null) or
// the count is reached. In a mixed run a consumer that finds the queue
// empty while producers remain sends one blocking GETJOB TIMEOUT (BRPOP)
// instead, so it waits rather than spins; Result.EmptyPolls counts these.
//
// # Latency
//
// Latency is measured per command, never per batch and never averaged:
// the clock starts when the batch is handed to the kernel (one write per
// batch) and stops when that command's reply has been read, so with P
// commands in flight the i-th reply's latency includes the server's time
// for the i-1 before it, as an application pipelining P deep sees it.
// Result.Latency has one observation per operation: a produced job (its
// command), a job consumed from diskque (GETJOB write to ACKJOB reply: a
// job is consumed once acknowledged) or from redis (its RPOP).
// Result.Commands keeps the per-command histograms. Histograms are
// log-bucketed with about 1% relative precision from 1 µs to 60 s;
// percentiles are read from the buckets, Max is exact.
//
// # Matrix
//
// RunMatrix starts servers itself (StartServer: a temporary directory, a
// free loopback port, readiness polled with PING and INFO loading:0) and
// runs every mode × pipeline × workload one after the other, stopping each
// server with SIGTERM before the next one starts.
//
// # Restart
//
// RunRestart starts a diskque-server on a temporary directory, fills it
// (produce or delayed), reads its RSS, SIGKILLs it, starts it again on the
// same directory and measures the time from that exec until it serves.
//
// # Churn
//
// RunChurn is the proof of the segment collector (package gc): it fills a
// standing backlog of delayed jobs, churns Count jobs through the server
// (added, delivered, acked) beside it, samples the data directory, waits
// for the collector to catch up, checks the directory against 3 × the live
// bytes + 2 segments, verifies every backlog job and its body with JSCAN,
// then SIGKILLs and restarts the server and verifies them again.
//
// # Charts and progress
//
// WriteChart draws a matrix's results as grouped bars (ops/s or p99 per
// mode × workload × pipeline) with gonum.org/v1/plot. Options.Progress
// receives a live progress line for runs longer than two seconds.
//
// # Concurrency
//
// Run and RunMatrix may be called from any goroutine; a run's clients
// share nothing but atomic counters. Reader, Writer and Histogram are not
// safe for concurrent use: each client goroutine owns its own, and the
// histograms are merged after the clients have returned.
package bench
