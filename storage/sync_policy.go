package storage

import "github.com/diskque/diskque/wal"

// SetSync switches the AOF fsync policy of the open store (CONFIG SET
// appendfsync): see wal.Log.SetSync. A switch to wal.SyncAlways, or away
// from wal.SyncEverySec, fsyncs what was written first; its error (the
// store then fails, as after any failed fsync) is returned, and the policy
// is switched all the same. A store opened again later takes Options.Sync:
// keep it in step.
func (s *Store) SetSync(p wal.SyncPolicy) error {
	if err := s.pin(); err != nil {
		return err
	}
	defer s.unpin()
	return s.log.SetSync(p)
}

// SyncPolicy returns the AOF fsync policy in effect.
func (s *Store) SyncPolicy() wal.SyncPolicy { return s.log.SyncPolicy() }
