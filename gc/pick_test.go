package gc

import (
	"slices"
	"testing"

	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// seg is a sealed, checkpointed segment of 100,000 bytes, pct percent live
// (LiveRatio counts each body's MOVE overhead too) in bodies bodies.
func seg(first wal.LSN, pct, bodies int64) storage.SegmentStat {
	st := storage.SegmentStat{First: first, Size: 100_000, LiveBodies: bodies, Checkpointed: true}
	st.LiveBytes = pct*1000 - st.LiveOverhead()
	return st
}

func TestPick(t *testing.T) {
	active := storage.SegmentStat{First: 900, Size: 10, LiveBytes: 1, LiveBodies: 1, Active: true}
	fresh := seg(800, 10, 1)
	fresh.Checkpointed = false
	half := Policy{MinLiveRatio: 0.5}
	for _, tc := range []struct {
		name string
		segs []storage.SegmentStat
		p    Policy
		want []wal.LSN
	}{
		{"empty log", nil, half, nil},
		{"only the active segment", []storage.SegmentStat{active}, half, nil},
		{"dense segments stay", []storage.SegmentStat{seg(0, 90, 9), seg(100, 50, 5), active}, half, nil},
		{"dead segments are the checkpoint's", []storage.SegmentStat{seg(0, 0, 0), active}, half, nil},
		{"a segment not yet checkpointed waits", []storage.SegmentStat{fresh, active}, half, nil},
		{"sparsest first", []storage.SegmentStat{seg(0, 40, 4), seg(100, 10, 1), seg(200, 90, 9), seg(300, 20, 2), active}, half,
			[]wal.LSN{100, 300, 0}},
		{"equal ratios oldest first", []storage.SegmentStat{seg(200, 10, 1), seg(0, 10, 1), seg(100, 10, 1)}, half,
			[]wal.LSN{0, 100, 200}},
		{"the byte bound stops the list", []storage.SegmentStat{seg(0, 10, 1), seg(100, 20, 2), seg(200, 30, 3)},
			Policy{MinLiveRatio: 0.5, MaxMoveBytes: 35_000}, []wal.LSN{0, 100}},
		{"the first pick is taken whatever its size", []storage.SegmentStat{seg(0, 40, 4), seg(100, 45, 4)},
			Policy{MinLiveRatio: 0.5, MaxMoveBytes: 5_000}, []wal.LSN{0}},
		{"full collection takes dense segments too", []storage.SegmentStat{seg(0, 99, 9), seg(100, 0, 0), seg(200, 60, 6), fresh, active},
			Policy{MinLiveRatio: 1}, []wal.LSN{200, 0}},
		{"a ratio of exactly the threshold stays", []storage.SegmentStat{seg(0, 50, 5)}, half, nil},
		{"with history, a segment still being drained waits", []storage.SegmentStat{seg(0, 10, 1), seg(100, 20, 2), seg(200, 30, 3)},
			Policy{MinLiveRatio: 0.5, Previous: map[wal.LSN]int64{0: seg(0, 15, 2).LiveBytes, 100: seg(100, 20, 2).LiveBytes}},
			[]wal.LSN{100}},
		{"with history, a segment not seen before waits", []storage.SegmentStat{seg(0, 10, 1), seg(100, 20, 2)},
			Policy{MinLiveRatio: 0.5, Previous: map[wal.LSN]int64{}}, nil},
		{"a full collection ignores history", []storage.SegmentStat{seg(0, 10, 1)},
			Policy{MinLiveRatio: 1, Previous: map[wal.LSN]int64{}}, []wal.LSN{0}},
		{"live jobs' headers are not garbage", []storage.SegmentStat{
			// 300 live 100-byte jobs in 72 kB of ADD records: 42% of the
			// bytes are bodies, but a rewrite would keep 68% of them.
			{First: 0, Size: 72_000, LiveBytes: 30_000, LiveBodies: 300, Checkpointed: true}}, half, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pick(tc.segs, tc.p); !slices.Equal(got, tc.want) {
				t.Fatalf("pick = %v, want %v", got, tc.want)
			}
		})
	}
}
