package server

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/diskque/diskque/gc"
	"github.com/diskque/diskque/storage"
	"github.com/tidwall/redcon"
)

// Version is diskque's version, reported by INFO.
const Version = "0.1.0"

func init() {
	register(
		&command{name: "ping", arity: -1, whileLoading: true, run: cmdPing},
		&command{name: "quit", arity: 1, whileLoading: true, run: cmdQuit},
		&command{name: "info", arity: -1, whileLoading: true, run: cmdInfo},
		&command{name: "time", arity: 1, whileLoading: true, run: cmdTime},
		&command{name: "debug", arity: -2, run: cmdDebug},
		&command{name: "command", arity: -1, whileLoading: true, run: cmdCommand},
		&command{name: "shutdown", arity: -1, whileLoading: true, run: cmdShutdown},
		&command{name: "bgrewriteaof", arity: 1, run: cmdBgRewriteAOF},
	)
}

// cmdBgRewriteAOF starts a full segment collection (package gc): every
// sealed AOF segment that still holds a live job body is rewritten and
// removed, and the index's queue and schedule spans are compacted. Like
// Redis it replies at once; INFO's aof_rewrite_in_progress and Storage
// section tell how it went.
func cmdBgRewriteAOF(s *Server, c *call) {
	col := s.collector.Load()
	if col == nil {
		c.conn.WriteError("ERR no segment collector is running")
		return
	}
	switch err := col.Start(true); {
	case errors.Is(err, gc.ErrBusy):
		c.conn.WriteError("ERR Background append only file rewriting already in progress")
	case errors.Is(err, gc.ErrNoRoom):
		// Copying the live bodies forward would take the disk below
		// min-free-disk: nothing started (INFO gc_last_skip_reason).
		c.conn.WriteError("NOSPACE Background append only file rewriting not started: " +
			strings.TrimPrefix(err.Error(), "gc: "))
	case err != nil:
		c.conn.WriteError(errorReply(err))
	default:
		c.conn.WriteString("Background append only file rewriting started")
	}
}

func cmdPing(s *Server, c *call) {
	switch len(c.args) {
	case 1:
		c.conn.WriteString("PONG")
	case 2:
		c.conn.WriteBulk(c.args[1])
	default:
		c.conn.WriteError("ERR wrong number of arguments for 'ping' command")
	}
}

func cmdQuit(s *Server, c *call) {
	c.conn.WriteString("OK")
	flush(c.conn)
	c.conn.Close()
	c.consumed = len(c.rest) // nothing after QUIT runs
}

func cmdTime(s *Server, c *call) {
	now := time.Now()
	c.conn.WriteArray(2)
	c.conn.WriteBulkString(strconv.FormatInt(now.Unix(), 10))
	c.conn.WriteBulkString(strconv.FormatInt(int64(now.Nanosecond()/1000), 10))
}

func cmdDebug(s *Server, c *call) {
	switch strings.ToLower(string(c.args[1])) {
	case "flushall":
		if err := c.broker.FlushAll(); err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
		c.conn.WriteString("OK")
	case "sleep":
		debugSleep(s, c)
	default:
		c.conn.WriteError(fmt.Sprintf("ERR unknown DEBUG subcommand '%s'", truncate(string(c.args[1]), 64)))
	}
}

// debugSleep: DEBUG SLEEP seconds (fractions allowed) stalls this
// connection only — a slow client for tests. Close cuts it short.
func debugSleep(s *Server, c *call) {
	if len(c.args) != 3 {
		c.conn.WriteError("ERR wrong number of arguments for 'debug|sleep' command")
		return
	}
	sec, err := strconv.ParseFloat(string(c.args[2]), 64)
	if err != nil || !(sec >= 0 && sec <= 1e6) { // written so that NaN fails too
		c.conn.WriteError("ERR value is not a valid float")
		return
	}
	t := time.NewTimer(time.Duration(sec * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.ctx.Done():
	}
	c.conn.WriteString("OK")
}

// cmdShutdown: SHUTDOWN [NOSAVE|SAVE|NOW|FORCE…] stops the server the
// graceful way (every job is already in the AOF; the options change
// nothing). Like Redis it does not reply: the connection just closes.
func cmdShutdown(s *Server, c *call) {
	for _, a := range c.args[1:] {
		switch strings.ToLower(string(a)) {
		case "nosave", "save", "now", "force", "abort":
		default:
			c.conn.WriteError(errSyntax)
			return
		}
		if is(a, "abort") {
			c.conn.WriteError("ERR No shutdown in progress.")
			return
		}
	}
	s.opts.Logger.Info("SHUTDOWN asked by a client", "addr", c.client.addr)
	c.conn.Close()
	c.consumed = len(c.rest)
	s.shutdownOnce.Do(func() {
		if s.opts.OnShutdown != nil {
			s.opts.OnShutdown()
			return
		}
		// Close waits for running commands, this one included.
		go s.Close()
	})
}

// commandFlags are COMMAND's flags per command, Disque's table in Redis's
// words. A command not listed gets "loading" if it runs while loading.
var commandFlags = map[string][]string{
	"addjob":       {"write", "denyoom", "fast"},
	"getjob":       {"write", "fast"},
	"ackjob":       {"write", "fast"},
	"fastack":      {"write", "fast"},
	"nack":         {"write", "fast"},
	"working":      {"write", "fast"},
	"enqueue":      {"write"},
	"dequeue":      {"write"},
	"deljob":       {"write"},
	"pause":        {"readonly"},
	"show":         {"readonly"},
	"qlen":         {"readonly", "fast"},
	"qpeek":        {"readonly"},
	"qstat":        {"readonly"},
	"qscan":        {"readonly"},
	"jscan":        {"readonly"},
	"ping":         {"readonly", "stale", "fast"},
	"time":         {"readonly", "random", "fast"},
	"hello":        {"readonly", "fast"},
	"info":         {"readonly", "loading", "stale"},
	"auth":         {"readonly", "noscript", "loading", "stale", "fast", "no_auth"},
	"quit":         {"readonly", "loading", "stale", "fast", "no_auth"},
	"client":       {"admin", "readonly", "loading", "stale"},
	"command":      {"readonly", "loading", "stale"},
	"shutdown":     {"admin", "readonly", "loading", "stale"},
	"bgrewriteaof": {"admin"},
	"debug":        {"admin", "noscript"},
	"cluster":      {"admin", "readonly"},
	"config":       {"admin", "noscript", "loading", "stale"},
	"slowlog":      {"admin", "random", "loading", "stale"},
	"monitor":      {"admin", "noscript", "loading", "stale"},
}

// cmdCommand: COMMAND → one [name, arity, flags, first-key, last-key,
// step] per command (queues are not Redis keys: 0, 0, 0); COMMAND COUNT;
// COMMAND INFO name…; COMMAND DOCS → an empty array (redis-cli asks on
// start).
func cmdCommand(s *Server, c *call) {
	if len(c.args) == 1 {
		names := make([]string, 0, len(commands))
		for name := range commands {
			names = append(names, name)
		}
		slices.Sort(names)
		c.conn.WriteArray(len(names))
		for _, name := range names {
			writeCommandInfo(c.conn, commands[name])
		}
		return
	}
	switch strings.ToLower(string(c.args[1])) {
	case "count":
		c.conn.WriteInt(len(commands))
	case "docs":
		c.conn.WriteArray(0)
	case "info":
		c.conn.WriteArray(len(c.args) - 2)
		for _, a := range c.args[2:] {
			if cmd := commands[strings.ToLower(string(a))]; cmd != nil {
				writeCommandInfo(c.conn, cmd)
			} else {
				c.conn.WriteNull()
			}
		}
	default:
		c.conn.WriteError(fmt.Sprintf("ERR unknown COMMAND subcommand '%s'", truncate(string(c.args[1]), 64)))
	}
}

func writeCommandInfo(conn redcon.Conn, cmd *command) {
	flags, ok := commandFlags[cmd.name]
	if !ok && cmd.whileLoading {
		flags = []string{"loading"}
	}
	conn.WriteArray(6)
	conn.WriteBulkString(cmd.name)
	conn.WriteInt(cmd.arity)
	conn.WriteArray(len(flags))
	for _, f := range flags {
		conn.WriteString(f)
	}
	conn.WriteInt(0)
	conn.WriteInt(0)
	conn.WriteInt(0)
}

// cmdInfo writes INFO in Disque's section order: Server, Clients, Memory,
// Jobs, Queues, Persistence, Stats, then diskque's own Storage (once
// loaded), then CPU. No value contains '#'.
//
// Sections are joined as Redis and Disque join them: each ends with CRLF
// and a blank line separates them, so every section but the last ends with
// a blank line. disqueue-node splits the reply on '#' and drops the last
// two lines of each piece — the blank ones, except in the last section,
// where it loses a real line. Storage therefore sits before CPU, whose last
// line (used_cpu_user_children) is the one Disque's clients already lose.
func cmdInfo(s *Server, c *call) {
	want := ""
	if len(c.args) > 1 {
		want = strings.ToLower(string(c.args[1]))
	}
	var sections []string
	add := func(name string, lines ...string) {
		if want != "" && want != "all" && want != "default" && want != strings.ToLower(name) {
			return
		}
		sections = append(sections, "# "+name+"\r\n"+strings.Join(lines, "\r\n")+"\r\n")
	}
	_, port := s.addrParts()
	uptime := time.Since(s.start)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	add("Server",
		"disque_version:1.0.0",
		"diskque_version:"+Version,
		"os:"+runtime.GOOS,
		fmt.Sprintf("arch_bits:%d", strconv.IntSize),
		"multiplexing_api:goroutines",
		"go_version:"+runtime.Version(),
		fmt.Sprintf("process_id:%d", os.Getpid()),
		"tcp_port:"+port,
		fmt.Sprintf("uptime_in_seconds:%d", int64(uptime.Seconds())),
		fmt.Sprintf("uptime_in_days:%d", int64(uptime.Hours()/24)),
	)
	blocked := 0
	if c.broker != nil {
		blocked = c.broker.Stats().BlockedClients
	}
	add("Clients",
		fmt.Sprintf("connected_clients:%d", s.connectedClients()),
		fmt.Sprintf("blocked_clients:%d", blocked),
	)
	used := s.usedMemory()
	reqHeld, reqWaiting := s.reqMem.stats()
	add("Memory",
		fmt.Sprintf("used_memory:%d", used),
		"used_memory_human:"+humanBytes(uint64(used)),
		fmt.Sprintf("used_memory_rss:%d", rssBytes()),
		fmt.Sprintf("used_memory_sys:%d", ms.Sys),
		fmt.Sprintf("used_memory_requests:%d", reqHeld),
		fmt.Sprintf("used_memory_requests_budget:%d", s.requestBudget()),
		fmt.Sprintf("request_bodies_waiting:%d", reqWaiting),
	)
	jobs, queued, queues := int64(0), int64(0), 0
	if c.broker != nil {
		st := c.broker.Store().Stats()
		jobs, queued, queues = st.Jobs, st.Queued, c.broker.RegisteredQueues()
	}
	// queued_jobs (beyond Disque): the jobs in this node's queues, all
	// queues; a leaving node is drained once it is 0 (README "A cluster").
	add("Jobs", fmt.Sprintf("registered_jobs:%d", jobs), fmt.Sprintf("queued_jobs:%d", queued))
	add("Queues", fmt.Sprintf("registered_queues:%d", queues))
	loading := 1
	if c.broker != nil {
		loading = 0
	}
	aof := "off"
	if s.opts.Info.AOFEnabled {
		aof = "on"
	}
	// A store that failed (a disk error) or was opened read-only (a full
	// disk) refuses every write until the daemon reopens it.
	writeStatus := "ok"
	if c.broker != nil && c.broker.Store().Failing() {
		writeStatus = "err"
		if aof == "on" {
			aof = "failed"
		}
	}
	add("Persistence",
		fmt.Sprintf("loading:%d", loading),
		fmt.Sprintf("aof_enabled:%d", boolInt(s.opts.Info.AOFEnabled)),
		"aof_state:"+aof,
		fmt.Sprintf("aof_enabled_after_restart:%d", boolInt(s.aofAfterRestart())),
		"aof_fsync:"+s.appendFsync(),
		fmt.Sprintf("aof_rewrite_in_progress:%d", boolInt(s.collecting())),
		"aof_last_bgrewrite_status:"+s.lastCollectStatus(),
		"aof_last_write_status:"+writeStatus,
	)
	var stats []string
	stats = append(stats,
		fmt.Sprintf("total_connections_received:%d", s.conns.Load()),
		fmt.Sprintf("total_commands_processed:%d", s.commands.Load()),
	)
	if c.broker != nil {
		bs := c.broker.Stats()
		stats = append(stats,
			fmt.Sprintf("jobs_added:%d", bs.JobsAdded),
			fmt.Sprintf("jobs_delivered:%d", bs.JobsDelivered),
			fmt.Sprintf("jobs_acked:%d", bs.JobsAcked),
			fmt.Sprintf("jobs_requeued:%d", bs.JobsRequeued),
			fmt.Sprintf("jobs_expired:%d", bs.JobsExpired),
			// Jobs whose body GETJOB could not read from the AOF: left
			// queued and undelivered (see the server log).
			fmt.Sprintf("jobs_unreadable:%d", bs.JobsUnreadable),
		)
	}
	add("Stats", stats...)
	if c.broker != nil {
		add("Storage", append(storageInfo(c.broker.Store()), s.collectorInfo()...)...)
	}
	add("Cluster", s.clusterInfo(c)...)
	var ru, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	// CPU stays last, and keeps Disque's four lines: disqueue-node drops the
	// last line of the last section (see above), which is then
	// used_cpu_user_children, as with Disque, and never one of ours.
	add("CPU",
		fmt.Sprintf("used_cpu_sys:%.2f", tvSeconds(ru.Stime)),
		fmt.Sprintf("used_cpu_user:%.2f", tvSeconds(ru.Utime)),
		fmt.Sprintf("used_cpu_sys_children:%.2f", tvSeconds(children.Stime)),
		fmt.Sprintf("used_cpu_user_children:%.2f", tvSeconds(children.Utime)),
	)
	c.conn.WriteBulkString(strings.Join(sections, "\r\n"))
}

// storageInfo is INFO's Storage section: the AOF segments and their live
// data, and the Pebble index.
func storageInfo(st *storage.Store) []string {
	stats := st.Stats()
	var aofBytes, bodies, live int64
	for _, seg := range stats.Segments {
		aofBytes += seg.Size
		bodies += seg.LiveBodies
		live += seg.LiveBytes
	}
	ratio := 0.0
	if aofBytes > 0 {
		ratio = float64(live) / float64(aofBytes)
	}
	m := st.IndexMetrics()
	hitRate := 0.0
	if total := m.BlockCache.Hits + m.BlockCache.Misses; total > 0 {
		hitRate = float64(m.BlockCache.Hits) / float64(total)
	}
	// What Pebble wrote since the store opened: the flushes of memtables
	// into L0 and the compactions' output, summed over the levels, so that a
	// change to the index's options or keys can be weighed by the bytes it
	// costs (bench/README.md).
	var flushed, compacted, compactRead uint64
	for _, l := range m.Levels {
		flushed += l.TableBytesFlushed
		compacted += l.TableBytesCompacted
		compactRead += l.TableBytesRead
	}
	return []string{
		fmt.Sprintf("segments:%d", len(stats.Segments)),
		fmt.Sprintf("aof_bytes:%d", aofBytes),
		fmt.Sprintf("live_bodies:%d", bodies),
		fmt.Sprintf("live_bytes:%d", live),
		fmt.Sprintf("live_ratio:%.3f", ratio),
		fmt.Sprintf("applied_lsn:%d", uint64(stats.Applied)),
		fmt.Sprintf("index_size:%d", m.DiskSpaceUsage()),
		fmt.Sprintf("index_l0_files:%d", m.Levels[0].TablesCount),
		fmt.Sprintf("index_flushes:%d", m.Flush.Count),
		fmt.Sprintf("index_flushed_bytes:%d", flushed),
		fmt.Sprintf("index_compactions:%d", m.Compact.Count),
		fmt.Sprintf("index_compacted_bytes:%d", compacted),
		fmt.Sprintf("index_compaction_read_bytes:%d", compactRead),
		fmt.Sprintf("memtable_bytes:%d", m.MemTable.Size),
		fmt.Sprintf("index_write_buffer_bytes:%d", stats.WriteBufferBytes),
		fmt.Sprintf("index_write_buffer_flushes:%d", stats.WriteBufferFlushes),
		fmt.Sprintf("index_write_stalls:%d", stats.IndexStalls),
		fmt.Sprintf("index_write_stall_ms:%d", stats.IndexStallTime.Milliseconds()),
		fmt.Sprintf("block_cache_hit_rate:%.3f", hitRate),
		fmt.Sprintf("aof_verify:%s", stats.Verify.State),
		fmt.Sprintf("aof_verify_segments:%d", stats.Verify.Segments),
		fmt.Sprintf("aof_verify_segments_total:%d", stats.Verify.Total),
		fmt.Sprintf("aof_verify_bytes:%d", stats.Verify.Bytes),
		fmt.Sprintf("aof_verify_damaged_segments:%d", stats.Verify.Damaged),
		fmt.Sprintf("aof_verify_last_damage:%s", oneLine(stats.Verify.LastDamage)),
		fmt.Sprintf("index_misplaced_bodies:%d", stats.Collect.MisplacedBodies),
	}
}

// collectorInfo is the Storage section's collection lines: what the
// segment collector (and the checkpoints that remove dead segments) did
// since the server started.
func (s *Server) collectorInfo() []string {
	var cs gc.Stats
	if col := s.collector.Load(); col != nil {
		cs = col.Stats()
	}
	var st storage.CollectStats
	if ref := s.useBroker(); ref != nil {
		b := ref.broker()
		st = b.Store().Stats().Collect
		ref.done()
	}
	return []string{
		fmt.Sprintf("gc_collections:%d", cs.Collections),
		fmt.Sprintf("gc_full_collections:%d", cs.FullCollections),
		fmt.Sprintf("gc_in_progress:%d", boolInt(cs.Running)),
		fmt.Sprintf("gc_segments_rewritten:%d", st.SegmentsRewritten),
		fmt.Sprintf("gc_bodies_moved:%d", st.BodiesMoved),
		fmt.Sprintf("gc_bytes_moved:%d", st.BytesMoved),
		fmt.Sprintf("gc_segments_removed:%d", st.SegmentsRemoved),
		fmt.Sprintf("gc_bytes_reclaimed:%d", st.BytesReclaimed),
		fmt.Sprintf("gc_index_compactions:%d", st.IndexCompactions),
		fmt.Sprintf("gc_skipped_for_space:%d", cs.SkippedForSpace),
		"gc_last_skip_reason:" + oneLine(cs.LastSkip),
	}
}

func (s *Server) collecting() bool {
	col := s.collector.Load()
	return col != nil && col.Stats().Running
}

// lastCollectStatus is Redis's aof_last_bgrewrite_status: ok unless the
// last collection failed.
func (s *Server) lastCollectStatus() string {
	if col := s.collector.Load(); col != nil && col.Stats().LastErr != nil {
		return "err"
	}
	return "ok"
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// rssBytes reads the resident set size from /proc (0 where there is none).
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

// flush sends what the connection has buffered.
func flush(conn redcon.Conn) {
	if r, ok := conn.(*replyConn); ok {
		conn = r.Conn
	}
	_ = redcon.BaseWriter(conn).Flush()
}
