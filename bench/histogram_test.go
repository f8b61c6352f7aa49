package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// within reports whether got is within 1% of want.
func within(got, want time.Duration) bool {
	diff := got - want
	if diff < 0 {
		diff = -diff
	}
	return float64(diff) <= 0.01*float64(want)
}

func TestHistogramUniform(t *testing.T) {
	// 1 µs, 2 µs, …, 100 000 µs (100 ms): rank r holds r µs.
	h := NewHistogram()
	for i := 1; i <= 100_000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{
		{0.50, 50_000 * time.Microsecond},
		{0.90, 90_000 * time.Microsecond},
		{0.99, 99_000 * time.Microsecond},
		{0.999, 99_900 * time.Microsecond},
		{0.0001, 10 * time.Microsecond},
	} {
		if got := h.Quantile(tc.q); !within(got, tc.want) {
			t.Errorf("Quantile(%v) = %v, want %v ± 1%%", tc.q, got, tc.want)
		}
	}
	if h.Count() != 100_000 {
		t.Errorf("Count = %d", h.Count())
	}
	if h.Min() != time.Microsecond || h.Max() != 100*time.Millisecond {
		t.Errorf("Min, Max = %v, %v; want exact 1µs, 100ms", h.Min(), h.Max())
	}
	if h.Quantile(1) != h.Max() || h.Quantile(0) != h.Min() {
		t.Errorf("Quantile(1), Quantile(0) = %v, %v", h.Quantile(1), h.Quantile(0))
	}
}

// TestHistogramAgainstSorted compares every percentile of log-normal-ish
// data with the exact order statistic.
func TestHistogramAgainstSorted(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	h := NewHistogram()
	var vals []time.Duration
	for range 50_000 {
		// 1 µs to about 30 s, spread over every power of ten.
		d := time.Duration(float64(time.Microsecond) * math.Pow(10, rng.Float64()*7.4))
		vals = append(vals, d)
		h.Record(d)
	}
	slices.Sort(vals)
	for _, q := range []float64{0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999} {
		rank := int(q*float64(len(vals)) + 0.999999999) // ceil
		want := vals[rank-1]
		if got := h.Quantile(q); !within(got, want) {
			t.Errorf("Quantile(%v) = %v, exact %v: more than 1%% off", q, got, want)
		}
	}
	if h.Max() != vals[len(vals)-1] {
		t.Errorf("Max = %v, want %v", h.Max(), vals[len(vals)-1])
	}
}

func TestHistogramSkewed(t *testing.T) {
	// 990 fast ops at 200 µs and 10 slow ones at 1 s: p99 is still fast,
	// p99.9 is slow — the outliers an average would hide.
	h := NewHistogram()
	h.RecordN(200*time.Microsecond, 990)
	h.RecordN(time.Second, 10)
	if got := h.Quantile(0.5); !within(got, 200*time.Microsecond) {
		t.Errorf("p50 = %v", got)
	}
	if got := h.Quantile(0.99); !within(got, 200*time.Microsecond) {
		t.Errorf("p99 = %v, want 200µs (rank 990 is the last fast one)", got)
	}
	if got := h.Quantile(0.991); !within(got, time.Second) {
		t.Errorf("p99.1 = %v, want 1s", got)
	}
	if got := h.Quantile(0.999); !within(got, time.Second) {
		t.Errorf("p99.9 = %v, want 1s", got)
	}
	if n := h.CountAbove(100 * time.Millisecond); n != 10 {
		t.Errorf("CountAbove(100ms) = %d, want 10", n)
	}
}

func TestHistogramEdges(t *testing.T) {
	h := NewHistogram()
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Count() != 0 {
		t.Fatal("empty histogram not zero")
	}
	// One value: every quantile is that value exactly (clamped to Min/Max).
	h.Record(1234567 * time.Nanosecond)
	for _, q := range []float64{0.001, 0.5, 0.999, 1} {
		if got := h.Quantile(q); got != 1234567*time.Nanosecond {
			t.Errorf("single value: Quantile(%v) = %v", q, got)
		}
	}
	// Below 1 µs and above 60 s are counted; Max stays exact.
	h = NewHistogram()
	h.Record(300 * time.Nanosecond)
	h.Record(-5) // clock oddity: counted as 0
	h.Record(2 * time.Minute)
	if h.Count() != 3 || h.Max() != 2*time.Minute || h.Min() != 0 {
		t.Errorf("Count, Min, Max = %d, %v, %v", h.Count(), h.Min(), h.Max())
	}
	if got := h.Quantile(0.5); got > time.Microsecond {
		t.Errorf("p50 = %v, want below 1µs", got)
	}
	if got := h.Quantile(0.9); !within(got, MaxTrackable) {
		t.Errorf("p90 = %v, want about %v (values above it are counted there)", got, MaxTrackable)
	}
}

func TestHistogramMerge(t *testing.T) {
	a, b, all := NewHistogram(), NewHistogram(), NewHistogram()
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i) * 37 * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	m := NewHistogram()
	m.Merge(a)
	m.Merge(NewHistogram()) // empty: no effect on Min
	m.Merge(b)
	if m.Count() != all.Count() || m.Min() != all.Min() || m.Max() != all.Max() {
		t.Fatalf("merged Count/Min/Max = %d/%v/%v, want %d/%v/%v",
			m.Count(), m.Min(), m.Max(), all.Count(), all.Min(), all.Max())
	}
	for _, q := range []float64{0.5, 0.99, 0.999} {
		if m.Quantile(q) != all.Quantile(q) {
			t.Errorf("merged Quantile(%v) = %v, want %v", q, m.Quantile(q), all.Quantile(q))
		}
	}
}

// TestBucketLayout: buckets tile [0, 2^36) ns without gaps, each at most
// 1/128 of its values wide, and bucketOf agrees with bucketRange.
func TestBucketLayout(t *testing.T) {
	var next int64
	for i := range numBucket {
		lo, w := bucketRange(i)
		if lo != next {
			t.Fatalf("bucket %d starts at %d, want %d", i, lo, next)
		}
		if lo >= 1<<minExp && float64(w) > float64(lo)/128 {
			t.Fatalf("bucket %d [%d,+%d) wider than 1/128", i, lo, w)
		}
		for _, v := range []int64{lo, lo + w - 1} {
			if v <= int64(MaxTrackable) && bucketOf(v) != i {
				t.Fatalf("bucketOf(%d) = %d, want %d", v, bucketOf(v), i)
			}
		}
		next = lo + w
	}
	if next <= int64(MaxTrackable) {
		t.Fatalf("buckets end at %d ns, below MaxTrackable", next)
	}
}
