package server

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/diskque/diskque/storage"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Prometheus metrics, served by MetricsHandler (the daemon's opt-in
// metrics-addr). Command labels are bounded: the registered command names,
// and "unknown" for anything else.

// metrics are the server's collectors, in a registry of its own.
type metrics struct {
	reg     *prometheus.Registry
	byName  map[string]commandMetrics // every registered command, and "unknown"
	unknown commandMetrics
}

// commandMetrics are one command's pre-bound collectors.
type commandMetrics struct {
	calls   prometheus.Counter
	latency prometheus.Observer
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), byName: map[string]commandMetrics{}}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "diskque_commands_processed_total",
		Help: "Commands processed, by command name (unknown for names not in the command table).",
	}, []string{"command"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "diskque_command_duration_seconds",
		Help:    "Time commands took to run, by command name (blocked GETJOB time included).",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10), // 10µs … 2.6s
	}, []string{"command"})
	bind := func(name string) commandMetrics {
		return commandMetrics{calls: calls.WithLabelValues(name), latency: latency.WithLabelValues(name)}
	}
	for name := range commands {
		m.byName[name] = bind(name)
	}
	m.unknown = bind("unknown")
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	// The Go runtime's and the process's own figures: the memory limit the
	// daemon sets (go_gc_gomemlimit_bytes), GC runs and pauses
	// (go_gc_duration_seconds), the heap, and the RSS and CPU of the process
	// (process_*), which the memory and pressure figures are read beside.
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(calls, latency,
		gauge("diskque_registered_jobs", "Jobs the node holds.",
			s.storeFigure(func(st storage.Stats) int64 { return st.Jobs })),
		gauge("diskque_queued_jobs", "Jobs queued, all queues.",
			s.storeFigure(func(st storage.Stats) int64 { return st.Queued })),
		gauge("diskque_aof_segments", "AOF segment files.",
			s.storeFigure(func(st storage.Stats) int64 { return int64(len(st.Segments)) })),
		gauge("diskque_aof_bytes", "Bytes in the AOF segment files.",
			s.storeFigure(func(st storage.Stats) int64 {
				var size int64
				for _, seg := range st.Segments {
					size += seg.Size
				}
				return size
			})),
		gauge("diskque_blocked_clients", "Clients blocked in GETJOB.", func() float64 {
			if ref := s.useBroker(); ref != nil {
				b := ref.broker()
				defer ref.done()
				return float64(b.Stats().BlockedClients)
			}
			return 0
		}),
		gauge("diskque_connected_clients", "Connected clients.", func() float64 {
			return float64(s.connectedClients())
		}),
		counter("diskque_aof_written_bytes_total", "Bytes ever appended to the AOF.",
			s.storeFigure(func(st storage.Stats) int64 { return int64(st.AOFEnd) })),
		counter("diskque_aof_fsyncs_total", "AOF fsyncs since the store was opened.",
			s.storeFigure(func(st storage.Stats) int64 { return st.AOFFsyncs })),
		counter("diskque_index_write_buffer_flushes_total", "Flushes of the index write buffer into Pebble.",
			s.storeFigure(func(st storage.Stats) int64 { return st.WriteBufferFlushes })),
		counter("diskque_index_write_stalls_total", "Index write stalls ended: spans in which writers waited for a memtable flush or an L0 compaction.",
			s.storeFigure(func(st storage.Stats) int64 { return st.IndexStalls })),
		counter("diskque_index_write_stall_seconds_total", "Summed length of the index write stalls.",
			s.storeValue(func(st storage.Stats) float64 { return st.IndexStallTime.Seconds() })),
		counter("diskque_gc_segments_removed_total", "AOF segments removed because no live job body was left in them.",
			s.storeFigure(func(st storage.Stats) int64 { return st.Collect.SegmentsRemoved })),
		counter("diskque_gc_bytes_reclaimed_total", "Bytes of the AOF segments removed.",
			s.storeFigure(func(st storage.Stats) int64 { return st.Collect.BytesReclaimed })),
		counter("diskque_gc_bodies_moved_total", "Live job bodies copied forward by segment rewrites.",
			s.storeFigure(func(st storage.Stats) int64 { return st.Collect.BodiesMoved })),
		counter("diskque_gc_bytes_moved_total", "Bytes of live job bodies copied forward by segment rewrites.",
			s.storeFigure(func(st storage.Stats) int64 { return st.Collect.BytesMoved })),
		counter("diskque_gc_collections_total", "Segment collections run (background and BGREWRITEAOF).", func() float64 {
			if col := s.collector.Load(); col != nil {
				return float64(col.Stats().Collections)
			}
			return 0
		}),
		gauge("diskque_index_bytes", "Bytes of the Pebble index on disk.", func() float64 {
			if ref := s.useBroker(); ref != nil {
				b := ref.broker()
				defer ref.done()
				return float64(b.Store().IndexMetrics().DiskSpaceUsage())
			}
			return 0
		}),
		queueLengths{s: s, desc: prometheus.NewDesc("diskque_queue_length",
			fmt.Sprintf("Jobs queued in each of the %d longest queues (bounded cardinality).", metricQueues),
			[]string{"queue"}, nil)},
	)
	m.reg.MustRegister(s.clusterCollectors()...)
	return m
}

func counter(name, help string, f func() float64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
}

// storeFigure reads one figure of the store's Stats; 0 while loading.
func (s *Server) storeFigure(f func(storage.Stats) int64) func() float64 {
	return s.storeValue(func(st storage.Stats) float64 { return float64(f(st)) })
}

// storeValue is storeFigure for a figure that is not a count.
func (s *Server) storeValue(f func(storage.Stats) float64) func() float64 {
	return func() float64 {
		if ref := s.useBroker(); ref != nil {
			b := ref.broker()
			defer ref.done()
			return f(b.Store().Stats())
		}
		return 0
	}
}

// metricQueues bounds diskque_queue_length's series: queue names are
// client-chosen, so exporting every one would let clients grow the
// metrics without bound.
const metricQueues = 20

// queueLengths exports the lengths of the longest queues.
type queueLengths struct {
	s    *Server
	desc *prometheus.Desc
}

func (q queueLengths) Describe(ch chan<- *prometheus.Desc) { ch <- q.desc }

func (q queueLengths) Collect(ch chan<- prometheus.Metric) {
	ref := q.s.useBroker()
	defer ref.done()
	b := ref.broker()
	if b == nil {
		return
	}
	qs := b.Store().Queues("", math.MaxInt)
	slices.SortFunc(qs, func(x, y storage.QueueInfo) int {
		if c := cmp.Compare(y.Len, x.Len); c != 0 {
			return c
		}
		return strings.Compare(x.Name, y.Name)
	})
	for _, qi := range qs[:min(len(qs), metricQueues)] {
		if qi.Len > 0 {
			ch <- prometheus.MustNewConstMetric(q.desc, prometheus.GaugeValue, float64(qi.Len), qi.Name)
		}
	}
}

// observe counts n runs of command name (already lower case) that took d
// together (n > 1 for a batch of pipelined ADDJOBs): each is observed with
// its share of d.
func (m *metrics) observe(name string, d time.Duration, n int) {
	cm, ok := m.byName[name]
	if !ok {
		cm = m.unknown
	}
	cm.calls.Add(float64(n))
	each := d.Seconds() / float64(n)
	for range n {
		cm.latency.Observe(each)
	}
}

// MetricsHandler serves the server's metrics in Prometheus's text format.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})
}
