package storage

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// The resume set (format 6). A clustered node's restart resumes what the
// restart interrupted: the collection of every acked job, and the end of
// every job left in wait-repl (package replication, Jobs.Start). Those jobs
// are few — an acked job is deleted once its collection ends, a wait-repl
// one within its ADDJOB's timeout — while the backlog can be millions, so
// the index keeps them findable without a scan of every job: an r/ key per
// job whose state is acked or wait-repl, written with the job's own keys
// (putJob), so the set is exactly those jobs at every applied LSN, after a
// crash's replay and after a rebuild from the log alike.

// needsResume reports whether a job in this state belongs to the resume
// set.
func needsResume(j *Job) bool {
	return j != nil && (j.State == StateAcked || j.State == StateWaitRepl)
}

// afterResumePage, if set (tests), runs between ScanResumable's read of
// a page of the set and its reads of the jobs: where another goroutine's
// write may come.
var afterResumePage func()

func resumeKey(id string) []byte { return appendResumeKey(make([]byte, 0, 1+len(id)), id) }

func appendResumeKey(dst []byte, id string) []byte {
	return append(append(dst, prefixResume), id...)
}

// ScanResumable returns up to limit jobs whose state is acked or
// wait-repl, in id order, with ids strictly greater than after ("" starts
// at the first); pass the last id returned to go on, and a page shorter
// than limit ends the scan. It reads the resume set, not every job, so its
// cost is the number of such jobs, not the backlog's — except on an index
// of format 5 or older opened read-only (never upgraded: it has no resume
// set), where it scans every job.
func (s *Store) ScanResumable(after string, limit int) ([]*Job, error) {
	if s.noResumeSet {
		var out []*Job
		for len(out) < limit {
			page, err := s.ScanJobs(after, 1024)
			if err != nil {
				return nil, err
			}
			for _, j := range page {
				if needsResume(j) && len(out) < limit {
					out = append(out, j)
				}
			}
			if len(page) < 1024 {
				break
			}
			after = page[len(page)-1].ID
		}
		return out, nil
	}
	if err := s.pin(); err != nil {
		return nil, err
	}
	defer s.unpin()
	var out []*Job
	// A job may leave the set between the read of a page of keys and the
	// read of the job (written meanwhile): the next page makes up for it,
	// so that a page shorter than limit still means the end of the set.
	for len(out) < limit {
		lower := []byte{prefixResume}
		if after != "" {
			lower = append(resumeKey(after), 0)
		}
		want := limit - len(out)
		ids, err := scanPage(s, lower, []byte{prefixResume + 1}, false, want, func(k, _ []byte) (string, error) {
			if len(k) != 1+JobIDLen {
				return "", errBadKey
			}
			return string(k[1:]), nil
		})
		if err != nil {
			return nil, err
		}
		if afterResumePage != nil {
			afterResumePage()
		}
		for _, id := range ids {
			j, err := s.job(id)
			if err != nil {
				// The key and the job change in the same write: a job gone
				// between the page and this read was deleted meanwhile.
				if errors.Is(err, ErrNotFound) {
					continue
				}
				return nil, err
			}
			if needsResume(j) { // it may have changed state meanwhile
				out = append(out, j)
			}
		}
		if len(ids) < want {
			break
		}
		after = ids[len(ids)-1]
	}
	return out, nil
}

// addResumeSet writes into b the resume set of an index of format 5 or
// older, which had none: one scan of its jobs, once, when Open upgrades it
// (before the replay, so the index is Pebble's alone).
func (s *Store) addResumeSet(b *pebble.Batch) (int, error) {
	start := time.Now()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixJob}, UpperBound: []byte{prefixJob + 1}})
	if err != nil {
		return 0, s.indexErr(err)
	}
	defer it.Close()
	n, scanned := 0, 0
	names := s.names.Load()
	for ok := it.First(); ok; ok = it.Next() {
		scanned++
		k := it.Key()
		j, err := decodeJob(string(k[1:]), it.Value(), names)
		if err != nil {
			return 0, fmt.Errorf("storage: upgrade: %w", err)
		}
		if needsResume(j) {
			if err := b.Set(resumeKey(j.ID), nil, nil); err != nil {
				return 0, err
			}
			n++
		}
	}
	if err := it.Error(); err != nil {
		return 0, s.indexErr(err)
	}
	s.opts.Logger.Info("storage: upgrade: the resume set written (once, for an index of an older format)",
		"jobs", scanned, "resumable", n, "took", time.Since(start))
	return n, nil
}
