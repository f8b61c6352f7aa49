package bench

import (
	"math/bits"
	"time"
)

// Histogram layout, HDR style: values are nanoseconds. Below 2^minExp ns
// (1.024 µs) buckets are linear, 2^(minExp-subBits) = 8 ns wide. From
// there every power of two [2^e, 2^(e+1)) is split into 2^subBits = 128
// equal buckets, so a bucket is at most 1/128 of its values wide (0.78%),
// and the midpoint we report is within 0.4% of every value in it. The
// top power of two holds 2^35 ns (34.4 s) to 2^36 ns (68.7 s); values
// above MaxTrackable are counted as MaxTrackable (Max stays exact).
const (
	subBits   = 7
	subCount  = 1 << subBits
	minExp    = 10
	maxExp    = 35
	numBucket = (maxExp - minExp + 2) * subCount

	// MaxTrackable is the largest latency the buckets resolve.
	MaxTrackable = 60 * time.Second
)

// Histogram counts durations in log-scaled buckets with about 1% relative
// precision from 1 µs to 60 s. Percentiles come from the buckets; Min and
// Max are exact. The zero value is not usable: call NewHistogram. A
// Histogram is not safe for concurrent use: give each goroutine its own
// and Merge them.
type Histogram struct {
	counts   []int64
	total    int64
	min, max time.Duration
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{counts: make([]int64, numBucket)}
}

// bucketOf returns the bucket index of v nanoseconds.
func bucketOf(v int64) int {
	if v < 0 {
		v = 0
	}
	if v > int64(MaxTrackable) {
		v = int64(MaxTrackable)
	}
	if v < 1<<minExp {
		return int(v >> (minExp - subBits))
	}
	e := bits.Len64(uint64(v)) - 1
	sub := int(v>>(e-subBits)) & (subCount - 1)
	return (e-minExp+1)*subCount + sub
}

// bucketRange returns the lowest value of bucket i and its width, in ns.
func bucketRange(i int) (lo, width int64) {
	if i < subCount {
		w := int64(1) << (minExp - subBits)
		return int64(i) * w, w
	}
	e := i/subCount - 1 + minExp
	sub := int64(i % subCount)
	w := int64(1) << (e - subBits)
	return (subCount + sub) * w, w
}

// Record adds one observation.
func (h *Histogram) Record(d time.Duration) { h.RecordN(d, 1) }

// RecordN adds n observations of the same duration.
func (h *Histogram) RecordN(d time.Duration, n int64) {
	if n <= 0 {
		return
	}
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(int64(d))] += n
	if h.total == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.total += n
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
}

// Count is the number of observations.
func (h *Histogram) Count() int64 { return h.total }

// Min is the smallest observation (exact), 0 if none.
func (h *Histogram) Min() time.Duration { return h.min }

// Max is the largest observation (exact), 0 if none.
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile returns the value below or at which a fraction q (0..1) of the
// observations lie: the observation of rank ceil(q·Count) in sorted
// order, reported as its bucket's midpoint clamped to [Min, Max].
// Quantile(1) is Max; an empty histogram gives 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	if q >= 1 {
		return h.max
	}
	if q <= 0 {
		return h.min
	}
	rank := int64(q * float64(h.total))
	if float64(rank) < q*float64(h.total) {
		rank++ // ceil
	}
	if rank < 1 {
		rank = 1
	}
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, w := bucketRange(i)
			v := time.Duration(lo + w/2)
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}

// CountAbove returns how many observations lie in buckets entirely above
// d: a lower bound on the observations greater than d (within a bucket's
// width).
func (h *Histogram) CountAbove(d time.Duration) int64 {
	first := bucketOf(int64(d)) + 1
	var n int64
	for _, c := range h.counts[min(first, len(h.counts)):] {
		n += c
	}
	return n
}
