package server

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// watchPeer cancels the returned context when the client at the other end of
// conn hangs up, so that a blocked GETJOB gives up instead of taking a job
// for a dead connection. It peeks at the socket (MSG_PEEK), so it consumes
// nothing: if the client sends more commands while blocked, watching stops
// and they are read after the GETJOB returns. stop ends the watch; call it
// before the connection is read again.
func watchPeer(parent context.Context, conn net.Conn) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return ctx, cancel
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		err := rc.Read(func(fd uintptr) bool {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(err, syscall.EAGAIN):
				return false // nothing yet: wait until readable
			case err == nil && n == 0:
				cancel() // orderly shutdown by the peer
			case err != nil:
				cancel() // reset or other error: the client is gone
			}
			return true // data (a pipelined command) or closed: stop
		})
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			cancel()
		}
	}()
	return ctx, func() {
		// Wake the watcher out of its wait, then restore the deadline.
		conn.SetReadDeadline(time.Now())
		<-done
		conn.SetReadDeadline(time.Time{})
		cancel()
	}
}
