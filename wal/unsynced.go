package wal

// keptBytes is the log's own copy of what it wrote since the last fsync
// that covered it: the bytes of the active segment from LSN from on, in
// fixed-size blocks so that keeping them costs one copy and trimming what an
// fsync made durable costs nothing (no growing slice copied over, no tail
// moved to the front). Guarded by Log.keptMu.
type keptBytes struct {
	from   LSN      // LSN of the first byte kept
	blocks [][]byte // full blocks, then the one being filled
	skip   int      // bytes at the start of blocks[0] already durable
	n      int      // bytes kept (after skip)
	free   [][]byte // blocks to reuse
}

const keptBlockSize = 1 << 20

// reset forgets everything kept; the next byte kept will be at from.
func (k *keptBytes) reset(from LSN) {
	for _, b := range k.blocks {
		k.recycle(b)
	}
	k.blocks, k.skip, k.n, k.from = k.blocks[:0], 0, 0, from
}

// keptFreeBlocks bounds the blocks kept for reuse: a quarter of what
// MaxUnsynced keeps by default, so that a burst does not hold on to its
// memory for good.
const keptFreeBlocks = 4

func (k *keptBytes) recycle(b []byte) {
	if len(k.free) < keptFreeBlocks {
		k.free = append(k.free, b[:0])
	}
}

// add keeps p, which follows the bytes kept so far.
func (k *keptBytes) add(p []byte) {
	k.n += len(p)
	for len(p) > 0 {
		if len(k.blocks) == 0 || len(k.blocks[len(k.blocks)-1]) == keptBlockSize {
			var b []byte
			if n := len(k.free); n > 0 {
				b, k.free = k.free[n-1], k.free[:n-1]
			} else {
				b = make([]byte, 0, keptBlockSize)
			}
			k.blocks = append(k.blocks, b)
		}
		last := &k.blocks[len(k.blocks)-1]
		c := min(len(p), keptBlockSize-len(*last))
		*last = append(*last, p[:c]...)
		p = p[c:]
	}
}

// dropTo forgets the bytes below lsn: an fsync made them durable.
func (k *keptBytes) dropTo(lsn LSN) {
	if lsn <= k.from {
		return
	}
	d := min(int(lsn-k.from), k.n)
	k.from += LSN(d)
	k.n -= d
	k.skip += d
	for len(k.blocks) > 0 && k.skip >= len(k.blocks[0]) && (len(k.blocks) > 1 || k.n == 0) {
		k.skip -= len(k.blocks[0])
		k.recycle(k.blocks[0])
		k.blocks = k.blocks[1:]
	}
	if len(k.blocks) == 0 {
		k.skip = 0
	}
}

// bytes returns a copy of everything kept.
func (k *keptBytes) bytes() []byte {
	out := make([]byte, 0, k.n)
	for i, b := range k.blocks {
		if i == 0 {
			b = b[k.skip:]
		}
		out = append(out, b...)
	}
	return out
}

// Unsynced is what a log that failed kept of the bytes it had written since
// its last successful fsync: give it to the next Open (Options.Rewrite) so
// that they are on disk again before anything is built on them. After a
// failed fsync the operating system may have dropped those pages while still
// serving them from its cache, so the file cannot be trusted past Synced.
type Unsynced struct {
	// Segment is the first LSN of the segment they belong to.
	Segment LSN
	// Synced is the end of the durable prefix: the segment is cut there.
	Synced LSN
	// Data is the bytes to write again at Synced (nil: only cut): those
	// written under everysec or no, which were acknowledged once written.
	// Under SyncAlways no write after the last fsync was acknowledged, so
	// none of them is kept.
	Data []byte
}

// Unsynced returns what must be written again after a failed fsync, or nil
// if the log did not fail an fsync (then the file holds everything written).
// Call it after Close.
func (l *Log) Unsynced() *Unsynced {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.syncFailed {
		return nil
	}
	u := &Unsynced{Segment: l.segs[len(l.segs)-1].first, Synced: l.synced}
	l.keptMu.Lock()
	defer l.keptMu.Unlock()
	if l.kept.from == l.synced && l.kept.n > 0 && l.lazyEnd > l.synced {
		data := l.kept.bytes()
		if n := l.lazyEnd - l.synced; n < LSN(len(data)) {
			data = data[:n] // what always wrote after them was not acknowledged
		}
		u.Data = data
	}
	return u
}
