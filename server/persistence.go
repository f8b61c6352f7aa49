package server

// persistInfo is what INFO's Persistence section says of the settings
// CONFIG SET changes: the fsync policy in effect (appendfsync applies at
// once) and whether the AOF is enabled after the next restart (appendonly
// applies at the next start). Unset, they are Options.Info's.
type persistInfo struct {
	appendFsync  string
	aofAtRestart bool
}

// SetPersistence tells INFO the fsync policy in effect and whether the
// server will keep its jobs on disk after a restart (INFO Persistence
// aof_enabled_after_restart; aof_enabled stays what this run does).
func (s *Server) SetPersistence(appendFsync string, aofAfterRestart bool) {
	s.persist.Store(&persistInfo{appendFsync: appendFsync, aofAtRestart: aofAfterRestart})
}

func (s *Server) appendFsync() string {
	if p := s.persist.Load(); p != nil {
		return p.appendFsync
	}
	return s.opts.Info.AppendFsync
}

func (s *Server) aofAfterRestart() bool {
	if p := s.persist.Load(); p != nil {
		return p.aofAtRestart
	}
	return s.opts.Info.AOFEnabled
}
