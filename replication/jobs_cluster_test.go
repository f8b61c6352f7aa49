package replication

import (
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// staticPeers is membership for in-process clusters: every node of the
// cluster is known; those the test marks down are not reachable (as
// membership would say once it noticed). It is the seam part M's
// Membership fills in the daemon.
type staticPeers struct {
	c    *testCluster
	self string
}

func (p staticPeers) Nodes() []NodeInfo {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	var out []NodeInfo
	for _, n := range p.c.ids {
		out = append(out, NodeInfo{ID: n, Myself: n == p.self, Leaving: p.c.leaving[n]})
	}
	return out
}

func (p staticPeers) Reachable() []NodeInfo {
	p.c.reachableCalls.Add(1)
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	var out []NodeInfo
	for _, n := range p.c.ids {
		if n != p.self && !p.c.down[n] {
			out = append(out, NodeInfo{ID: n})
		}
	}
	return out
}

// jobsNode is one node: a real store in its own directory, a broker, the
// job protocol and its end of the MemNetwork.
type jobsNode struct {
	dir    string
	fs     vfs.FS // the store's, if set before it opens (else the OS's; gatedFS holds its AOF fsyncs)
	id     string
	st     *storage.Store
	broker *queue.Broker
	jobs   *Jobs
	tr     *MemTransport
}

type testCluster struct {
	t     *testing.T
	net   *MemNetwork
	nodes []*jobsNode
	// AckRetryTick of every node's Jobs (negative: tests drive RetryAcks).
	ackTick time.Duration
	// now, if set, is every node's clock (broker and Jobs).
	now func() time.Time

	// reachableCalls counts the Peers.Reachable calls of every node.
	reachableCalls atomic.Int64

	mu      sync.Mutex
	ids     []string
	down    map[string]bool
	leaving map[string]bool // CLUSTER LEAVING yes (jobs_federation_test.go)
	// refusing: why a node refuses copies (JobsConfig.RefuseCopies;
	// jobs_refuse_test.go), "" or absent when it takes them.
	refusing map[string]string
	// lose, if set, says which messages are lost on their way (to, from):
	// the receiver never sees them, as with a link cut at that moment
	// (ackgc_held_test.go).
	lose func(to, from string, m Message) bool
	// hold, if set, is called with every batch before it is delivered
	// (to, from) and may block: that link's later messages wait behind
	// it, as on a stalled connection (jobs_async_late_test.go).
	hold func(to, from string, ms []Message)
}

func newTestCluster(t *testing.T, n int, ackTick time.Duration) *testCluster {
	t.Helper()
	return newTestClusterClock(t, n, ackTick, nil)
}

// newTestClusterClock is newTestCluster with now as every node's clock.
func newTestClusterClock(t *testing.T, n int, ackTick time.Duration, now func() time.Time) *testCluster {
	t.Helper()
	c := &testCluster{t: t, net: NewMemNetwork(), ackTick: ackTick, now: now, down: map[string]bool{}}
	for range n {
		c.nodes = append(c.nodes, &jobsNode{dir: t.TempDir()})
	}
	for _, nd := range c.nodes {
		c.open(nd)
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.close(nd)
		}
	})
	return c
}

// open opens (or reopens) a node on its directory and joins it.
func (c *testCluster) open(nd *jobsNode) {
	t := c.t
	t.Helper()
	opts := storage.TestingOptions()
	opts.FS, opts.Sync = vfs.Default, wal.SyncAlways
	if nd.fs != nil {
		opts.FS = nd.fs
	}
	opts.Logger = quietLog()
	st, err := storage.Open(nd.dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	nd.st, nd.id = st, st.NodeID()
	c.mu.Lock()
	known := false
	for _, id := range c.ids {
		known = known || id == nd.id
	}
	if !known {
		c.ids = append(c.ids, nd.id)
	}
	c.mu.Unlock()
	id := nd.id
	refuse := func() string {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.refusing[id]
	}
	nd.jobs, err = NewJobs(JobsConfig{ID: nd.id, Peers: staticPeers{c, nd.id}, Logger: quietLog(), AckRetryTick: c.ackTick, Now: c.now,
		RefuseCopies: refuse, PauseFile: filepath.Join(nd.dir, PausesFileName)})
	if err != nil {
		t.Fatal(err)
	}
	handle := nd.jobs.HandleBatchQueued
	nd.tr = c.net.JoinBatch(nd.id, func(from string, ms []Message) { // as the daemon delivers them
		c.mu.Lock()
		lose, hold := c.lose, c.hold
		c.mu.Unlock()
		if hold != nil {
			hold(id, from, ms)
		}
		if lose != nil {
			ms = slices.DeleteFunc(slices.Clone(ms), func(m Message) bool { return lose(id, from, m) })
		}
		if len(ms) > 0 {
			handle(from, ms)
		}
	})
	nd.broker, err = queue.New(queue.Options{Store: st, Cluster: nd.jobs, Logger: quietLog(), Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	go nd.broker.Run()
	c.setPeers()
	if err := nd.jobs.Start(nd.broker, nd.tr); err != nil {
		t.Fatal(err)
	}
}

// setPeers tells every transport about every node.
func (c *testCluster) setPeers() {
	c.mu.Lock()
	ids := append([]string(nil), c.ids...)
	c.mu.Unlock()
	for _, nd := range c.nodes {
		if nd.tr == nil {
			continue
		}
		for _, id := range ids {
			if id != nd.id {
				nd.tr.SetPeer(id, "")
			}
		}
	}
}

func (c *testCluster) close(nd *jobsNode) {
	if nd.st == nil {
		return
	}
	nd.jobs.Close()
	nd.tr.Close()
	nd.broker.Close()
	if err := nd.st.Close(); err != nil {
		c.t.Error(err)
	}
	nd.st = nil
}

func (c *testCluster) setDown(id string, down bool) {
	c.mu.Lock()
	c.down[id] = down
	c.mu.Unlock()
}

// state returns the job's state on node nd, or "" if nd does not have it.
func (nd *jobsNode) state(t *testing.T, id string) string {
	t.Helper()
	j, err := nd.st.Job(id)
	if errors.Is(err, storage.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return j.State.String()
}

// eventually polls cond until it holds, failing after a deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func addJob(t *testing.T, nd *jobsNode, r queue.AddRequest) queue.AddResult {
	t.Helper()
	if r.Queue == "" {
		r.Queue = "q"
	}
	if r.Body == nil {
		r.Body = []byte("body")
	}
	if r.TTL == 0 {
		r.TTL = 3600
	}
	if r.Retry == 0 {
		r.Retry = 60
	}
	return nd.broker.AddJobs([]queue.AddRequest{r})[0]
}
