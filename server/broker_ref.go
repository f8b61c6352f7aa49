package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/queue"
)

// brokerRef is one broker the server has been given, with a count of the
// commands (and INFO, metrics and guard readings) using it, so that the
// daemon can wait for them before it closes the store under the broker
// (SetBroker's drain).
//
// A user takes it with users.Add(1) and then checks retired; the drain sets
// retired and then waits for users to reach 0. Whichever of a user's check
// and the drain's store comes first, either the user backs off or the drain
// waits for it: no command runs on a broker whose store is being closed.
type brokerRef struct {
	b       *queue.Broker
	users   atomic.Int64
	retired atomic.Bool
	idle    chan struct{} // closed once retired with no user left
	once    sync.Once
}

func (r *brokerRef) release() {
	if r.users.Add(-1) == 0 && r.retired.Load() {
		r.once.Do(func() { close(r.idle) })
	}
}

// drain retires r and waits until no one uses it.
func (r *brokerRef) drain() {
	r.retired.Store(true)
	if r.users.Load() == 0 {
		r.once.Do(func() { close(r.idle) })
	}
	<-r.idle
}

// SetBroker makes b the broker that commands run on from now (nil: they get
// -LOADING) and returns a function that waits until every command that got
// the previous broker has finished. Replacing a broker whose store is to be
// closed (the daemon's reopen after a disk failure) therefore goes: SetBroker
// (nil), close the old broker (which wakes its blocked GETJOBs), drain, and
// only then close the store.
func (s *Server) SetBroker(b *queue.Broker) (drain func()) {
	var next *brokerRef
	if b != nil {
		next = &brokerRef{b: b, idle: make(chan struct{})}
	}
	prev := s.broker.Swap(next)
	s.loadMu.Lock()
	select {
	case <-s.loaded:
		if next == nil {
			s.loaded = make(chan struct{})
		}
	default:
		if next != nil {
			close(s.loaded)
		}
	}
	s.loadMu.Unlock()
	if prev == nil {
		return func() {}
	}
	return prev.drain
}

// useBroker returns the current broker's reference (nil while loading):
// its store stays open until done is called. (A reference, not a closure:
// every command takes one, and a closure would cost an allocation.)
func (s *Server) useBroker() *brokerRef {
	for {
		r := s.broker.Load()
		if r == nil {
			return nil
		}
		r.users.Add(1)
		if !r.retired.Load() {
			return r
		}
		// Retired after the swap that replaced it: the next load sees
		// its successor.
		r.release()
	}
}

// waitBroker waits, for at most Options.LoadingWait, for a broker while
// there is none (the store is recovering), and returns the reference
// useBroker then gives (nil if the wait ran out or the server closed).
func (s *Server) waitBroker() *brokerRef {
	wait := s.opts.LoadingWait
	if wait <= 0 {
		return nil
	}
	s.loadMu.Lock()
	loaded := s.loaded
	s.loadMu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-loaded:
	case <-timer.C:
	case <-s.ctx.Done():
		return nil
	}
	return s.useBroker()
}

// broker is the referenced broker; nil for a nil reference (loading).
func (r *brokerRef) broker() *queue.Broker {
	if r == nil {
		return nil
	}
	return r.b
}

// done ends a use that useBroker began; a nil reference is a no-op.
func (r *brokerRef) done() {
	if r != nil {
		r.release()
	}
}
