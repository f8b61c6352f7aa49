package server

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidwall/redcon"
)

// Version is diskque's version, reported by INFO.
const Version = "0.1.0"

func init() {
	register(
		&command{name: "ping", arity: -1, whileLoading: true, run: cmdPing},
		&command{name: "quit", arity: 1, whileLoading: true, run: cmdQuit},
		&command{name: "hello", arity: -1, whileLoading: true, run: cmdHello},
		&command{name: "info", arity: -1, whileLoading: true, run: cmdInfo},
		&command{name: "time", arity: 1, whileLoading: true, run: cmdTime},
		&command{name: "cluster", arity: -2, run: cmdCluster},
		&command{name: "debug", arity: -2, run: cmdDebug},
		&command{name: "client", arity: -2, whileLoading: true, run: cmdClient},
		&command{name: "command", arity: -1, whileLoading: true, run: cmdCommand},
	)
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

// cmdHello: HELLO → [1, my-id, [id, ip, port, priority]…]. Any argument
// (go-redis sends HELLO 3 to try RESP3) is an error, so RESP3 clients fall
// back to RESP2.
func cmdHello(s *Server, c *call) {
	if len(c.args) > 1 {
		c.conn.WriteError("ERR unsupported HELLO version or arguments: diskque speaks RESP2 (Disque's HELLO takes none)")
		return
	}
	if c.broker == nil {
		c.conn.WriteError(errLoading)
		return
	}
	host, port := s.advertised(c)
	c.conn.WriteArray(3)
	c.conn.WriteInt(1)
	c.conn.WriteBulkString(c.broker.NodeID())
	c.conn.WriteArray(4)
	c.conn.WriteBulkString(c.broker.NodeID())
	c.conn.WriteBulkString(host)
	c.conn.WriteBulkString(port)
	c.conn.WriteBulkString("1")
}

// cmdCluster: the lone node's view. Joining a cluster comes with
// replication.
func cmdCluster(s *Server, c *call) {
	id := c.broker.NodeID()
	host, port := s.advertised(c)
	switch strings.ToLower(string(c.args[1])) {
	case "myid":
		c.conn.WriteBulkString(id)
	case "nodes":
		c.conn.WriteBulkString(fmt.Sprintf("%s %s:%s myself 0 0 connected\n", id, host, port))
	case "info":
		c.conn.WriteBulkString("cluster_state:ok\r\ncluster_known_nodes:1\r\ncluster_reachable_nodes:1\r\n")
	default:
		c.conn.WriteError(fmt.Sprintf("ERR unknown or not yet supported CLUSTER subcommand '%s'", truncate(string(c.args[1]), 64)))
	}
}

func cmdDebug(s *Server, c *call) {
	switch strings.ToLower(string(c.args[1])) {
	case "flushall":
		if err := c.broker.FlushAll(); err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
		c.conn.WriteString("OK")
	default:
		c.conn.WriteError(fmt.Sprintf("ERR unknown DEBUG subcommand '%s'", truncate(string(c.args[1]), 64)))
	}
}

// cmdClient: the CLIENT family comes later; SETINFO (go-redis's handshake)
// must be an error, not a hang.
func cmdClient(s *Server, c *call) {
	c.conn.WriteError(fmt.Sprintf("ERR unknown CLIENT subcommand '%s'", truncate(string(c.args[1]), 64)))
}

// cmdCommand: redis-cli asks COMMAND DOCS on start; an error is fine.
func cmdCommand(s *Server, c *call) {
	c.conn.WriteError("ERR COMMAND is not supported yet")
}

// cmdInfo writes INFO in Disque's section order: Server, Clients, Memory,
// Jobs, Queues, Persistence, Stats, CPU. No value contains '#'.
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
	add("Memory",
		fmt.Sprintf("used_memory:%d", ms.HeapAlloc),
		"used_memory_human:"+humanBytes(ms.HeapAlloc),
		fmt.Sprintf("used_memory_rss:%d", rssBytes()),
		fmt.Sprintf("used_memory_sys:%d", ms.Sys),
	)
	jobs, queues := int64(0), 0
	if c.broker != nil {
		st := c.broker.Store().Stats()
		jobs, queues = st.Jobs, st.Queues
	}
	add("Jobs", fmt.Sprintf("registered_jobs:%d", jobs))
	add("Queues", fmt.Sprintf("registered_queues:%d", queues))
	loading := 1
	if c.broker != nil {
		loading = 0
	}
	aof := "off"
	if s.opts.Info.AOFEnabled {
		aof = "on"
	}
	add("Persistence",
		fmt.Sprintf("loading:%d", loading),
		fmt.Sprintf("aof_enabled:%d", boolInt(s.opts.Info.AOFEnabled)),
		"aof_state:"+aof,
		"aof_fsync:"+s.opts.Info.AppendFsync,
		"aof_rewrite_in_progress:0",
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
		)
	}
	add("Stats", stats...)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	add("CPU",
		fmt.Sprintf("used_cpu_sys:%.2f", tvSeconds(ru.Stime)),
		fmt.Sprintf("used_cpu_user:%.2f", tvSeconds(ru.Utime)),
	)
	c.conn.WriteBulkString(strings.Join(sections, "\r\n"))
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
	_ = redcon.BaseWriter(conn).Flush()
}
