package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

const checkUsage = `usage: diskque-server check --dir PATH [--repair]

Verifies a data directory with the server stopped, changing nothing: every
record of the append-only file (every checksum, every damaged span), and the
index against it (every job's body, queue order, schedule, counters). Prints
a summary; exits 0 if nothing is wrong, 1 if something is, 2 if it could not
check.

  --repair   replace each damaged span of the append-only file by a filler
             record, so that every record after it keeps its place and stays
             readable (the records in the span are lost; each original is
             kept beside it as <segment>.broken), then check again
`

// runCheck is `diskque-server check`: it returns the exit status.
func runCheck(args []string, out io.Writer) int {
	fl := flag.NewFlagSet("check", flag.ContinueOnError)
	fl.SetOutput(out)
	fl.Usage = func() { fmt.Fprint(out, checkUsage) }
	dir := fl.String("dir", "", "data directory")
	repair := fl.Bool("repair", false, "replace damaged spans of the AOF by fillers")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || fl.NArg() > 0 {
		fmt.Fprint(out, checkUsage)
		return 2
	}
	opts := storage.DefaultOptions()
	rep, err := storage.Check(*dir, opts)
	if err != nil {
		fmt.Fprintf(out, "diskque-server check: %v\n", err)
		return 2
	}
	printCheck(out, *dir, rep)
	if !*repair || len(rep.Damage) == 0 {
		if rep.OK() {
			return 0
		}
		if len(rep.Damage) > 0 {
			fmt.Fprintln(out, "\nTo keep every readable record and drop only the damaged spans, run it again with --repair.")
		}
		return 1
	}
	segs := map[string]bool{}
	for _, d := range rep.Damage {
		segs[d.Segment] = true
	}
	fs := opts.FS
	aof := filepath.Join(*dir, "aof")
	for _, d := range rep.Damage {
		if !segs[d.Segment] {
			continue
		}
		segs[d.Segment] = false
		first, err := segmentFirst(fs, aof, d.Segment)
		if err == nil {
			var sr wal.SegmentReport
			// The index replays from its applied LSN: a filler must
			// start there if the damage spans it.
			sr, err = wal.RepairSegment(fs, aof, first, rep.Applied)
			if err == nil {
				fmt.Fprintf(out, "repaired %s: %d damaged spans replaced; the original is %s.broken\n", d.Segment, len(sr.Damage), d.Segment)
			}
		}
		if err != nil {
			fmt.Fprintf(out, "diskque-server check: repair %s: %v\n", d.Segment, err)
			return 2
		}
	}
	fmt.Fprintln(out)
	if rep, err = storage.Check(*dir, opts); err != nil {
		fmt.Fprintf(out, "diskque-server check: %v\n", err)
		return 2
	}
	printCheck(out, *dir, rep)
	if rep.OK() {
		return 0
	}
	return 1
}

func segmentFirst(fs vfs.FS, dir, name string) (wal.LSN, error) {
	segs, err := wal.ListSegments(fs, dir)
	if err != nil {
		return 0, err
	}
	for _, s := range segs {
		if s.Name == name {
			return s.First, nil
		}
	}
	return 0, errors.New("no such segment")
}

func printCheck(out io.Writer, dir string, rep *storage.CheckReport) {
	fmt.Fprintf(out, "diskque check of %s (%v)\n", dir, rep.Took.Round(1e6))
	fmt.Fprintf(out, "aof:    %d segments, %d bytes, %d records; the index has applied it up to lsn %d of %d\n",
		rep.Segments, rep.AOFBytes, rep.Records, rep.Applied, rep.AOFEnd)
	fmt.Fprintf(out, "index:  %d jobs, %d queued in %d queues, node %s\n", rep.Jobs, rep.Queued, rep.Queues, rep.NodeID)
	if rep.Tail.TornBytes > 0 {
		fmt.Fprintf(out, "tail:   a torn tail of %d bytes at offset %d of the last segment (what a crash leaves; the next start cuts it)\n",
			rep.Tail.TornBytes, rep.Tail.TornOffset)
	}
	if rep.Tail.Damage != nil {
		fmt.Fprintf(out, "start:  the server refuses to start: %v\n", rep.Tail.Damage)
	}
	if len(rep.Damage) == 0 {
		fmt.Fprintln(out, "damage: none")
	}
	for _, d := range rep.Damage {
		to := "up to the next valid record"
		if d.ToEnd {
			to = "to the end of the segment"
		}
		fmt.Fprintf(out, "damage: %s offset %d (lsn %d): %d bytes, %s", d.Segment, d.Offset, uint64(d.LSN), d.Len, to)
		if len(d.Jobs) > 0 {
			ids := d.Jobs
			more := ""
			if len(ids) > 10 {
				ids, more = ids[:10], fmt.Sprintf(" and %d more", len(d.Jobs)-10)
			}
			fmt.Fprintf(out, "; the bodies of %d jobs are lost: %s%s", len(d.Jobs), strings.Join(ids, " "), more)
		}
		if !d.Repairable {
			fmt.Fprint(out, " (cannot be repaired in place)")
		}
		fmt.Fprintln(out)
	}
	if rep.ReleasePending > 0 {
		fmt.Fprintf(out, "index: %d deletion keys wait for segments already removed (the next start releases them)\n", rep.ReleasePending)
	}
	if rep.ProblemCount == 0 {
		fmt.Fprintln(out, "index problems: none")
	} else {
		fmt.Fprintf(out, "index problems: %d\n", rep.ProblemCount)
		for _, p := range rep.Problems {
			fmt.Fprintf(out, "  %s\n", p)
		}
		if rep.ProblemCount > len(rep.Problems) {
			fmt.Fprintf(out, "  ... and %d more\n", rep.ProblemCount-len(rep.Problems))
		}
	}
	if rep.OK() {
		fmt.Fprintln(out, "OK")
	} else {
		fmt.Fprintln(out, "NOT OK")
	}
}
