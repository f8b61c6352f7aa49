package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
)

const (
	segmentSuffix     = ".wal"
	tmpSuffix         = ".tmp"
	brokenSuffix      = ".broken"
	segmentHeaderSize = 16
)

var segmentMagic = [8]byte{'d', 'q', 'w', 'a', 'l', 0, 0, 1}

// segmentName is the file name of the segment whose first LSN is first.
func segmentName(first LSN) string { return fmt.Sprintf("%016x%s", uint64(first), segmentSuffix) }

// parseSegmentName is the inverse of segmentName; ok is false for any other
// file name (temporary and .broken files included).
func parseSegmentName(name string) (first LSN, ok bool) {
	hex, found := strings.CutSuffix(name, segmentSuffix)
	if !found || len(hex) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || strings.ToLower(hex) != hex {
		return 0, false
	}
	return LSN(v), true
}

// segment is one file of the log, as known to the Log.
type segment struct {
	first LSN   // LSN of the first frame
	size  int64 // bytes of frames (file size minus the header)
}

func (s segment) end() LSN { return s.first + LSN(s.size) }

func segmentHeader(first LSN) []byte {
	h := make([]byte, segmentHeaderSize)
	copy(h, segmentMagic[:])
	binary.BigEndian.PutUint64(h[8:], uint64(first))
	return h
}

// checkSegmentHeader verifies a segment file's header against its name.
func checkSegmentHeader(h []byte, first LSN) error {
	if len(h) < segmentHeaderSize || !bytes.Equal(h[:8], segmentMagic[:]) {
		return fmt.Errorf("%w: bad segment header", ErrCorrupt)
	}
	if got := LSN(binary.BigEndian.Uint64(h[8:16])); got != first {
		return fmt.Errorf("%w: segment header says first lsn %d, name says %d", ErrCorrupt, got, first)
	}
	return nil
}

// listSegments returns the directory's segments in log order, removing stale
// temporary files left by a crash during segment creation or repair.
func listSegments(fs vfs.FS, dir string) ([]segment, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: list %s: %w", dir, err)
	}
	var segs []segment
	for _, name := range names {
		if strings.HasSuffix(name, tmpSuffix) {
			if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				return nil, fmt.Errorf("wal: remove stale %s: %w", name, err)
			}
			continue
		}
		first, ok := parseSegmentName(name)
		if !ok {
			continue
		}
		st, err := fs.Stat(fs.PathJoin(dir, name))
		if err != nil {
			return nil, fmt.Errorf("wal: stat %s: %w", name, err)
		}
		segs = append(segs, segment{first: first, size: st.Size() - segmentHeaderSize})
	}
	slices.SortFunc(segs, func(a, b segment) int { return cmpLSN(a.first, b.first) })
	return segs, nil
}

func cmpLSN(a, b LSN) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// writeFileAtomic makes dir/name hold exactly data, crash-safely: write
// name.tmp, fsync, rename, fsync the directory.
func writeFileAtomic(fs vfs.FS, dir, name string, data []byte) error {
	tmp := fs.PathJoin(dir, name+tmpSuffix)
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, fs.PathJoin(dir, name)); err != nil {
		return err
	}
	return durable.SyncDir(fs, dir)
}

// createSegment makes a new, empty segment crash-safely and opens it for
// appending.
func createSegment(fs vfs.FS, dir string, first LSN) (vfs.File, error) {
	name := segmentName(first)
	if err := writeFileAtomic(fs, dir, name, segmentHeader(first)); err != nil {
		return nil, fmt.Errorf("wal: create segment %s: %w", name, err)
	}
	return openForAppend(fs, dir, name)
}

// openForAppend opens an existing segment with its write offset at the end.
func openForAppend(fs vfs.FS, dir, name string) (vfs.File, error) {
	path := fs.PathJoin(dir, name)
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: stat segment %s: %w", name, err)
	}
	return &appendFile{File: f, off: st.Size()}, nil
}

// appendFile turns positional writes into appends: OpenReadWrite does not
// promise that Write starts at the end of an existing file.
type appendFile struct {
	vfs.File
	off int64
}

func (a *appendFile) Write(p []byte) (int, error) {
	n, err := a.File.WriteAt(p, a.off)
	a.off += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}
