package server

import (
	"errors"
	"fmt"
	"strings"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// The RESP error replies. Texts follow Disque's to the letter where Disque
// fixed them (COMPATIBILITY.md).
const (
	errNoSpace      = "NOSPACE Not enough free disk space to accept new jobs (min-free-disk), try later"
	errOOM          = "OOM command not allowed when used memory > 'maxmemory'."
	errBadID        = "BADID Invalid Job ID format."
	errNoJob        = "NOJOB Job not known in the context of this node."
	errTooLate      = "TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery."
	errNoRepl       = "NOREPL Not enough reachable nodes for the requested replication level"
	errReplTimeout  = "NOREPL Timeout reached before replicating to the requested number of nodes"
	errMaxLen       = "MAXLEN Queue is already longer than the specified MAXLEN count"
	errPausedIn     = "PAUSED Queue paused in input, try later"
	errLoading      = "LOADING diskque is loading the AOF, please retry"
	errSyntax       = "ERR syntax error"
	errNotInteger   = "ERR value is not an integer or out of range"
	errRetryRepl    = "ERR With RETRY set to 0 please explicitly set REPLICATE to 1 (at-most-once delivery)"
	errDelayTTL     = "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered"
	errShuttingDown = "ERR server is shutting down"
	errLeaving      = "LEAVING This node is leaving the cluster, please connect to a different one"
	errInternal     = "ERR internal error" // a handler panicked (mux.go run)

	// A failed store: the same text whatever the error, which wraps the
	// store's internals and names files; the store logs it (at ERROR, once,
	// when it fails).
	errStoreFailed  = "IOERR the store failed (a disk error); writes are refused until the disk works again"
	errIndexCorrupt = "IOERR the index is corrupt; writes are refused until it is rebuilt from the append-only file"

	errNoAuth        = "NOAUTH Authentication required."
	errBadPassword   = "ERR invalid password"
	errNoPasswordSet = "ERR Client sent AUTH, but no password is set"
	errDenied        = "DENIED diskque is running without a password on a non-loopback address; set requirepass or bind to 127.0.0.1"
	errMaxClients    = "ERR max number of clients reached"
	errJobTooLarge   = "ERR job body is larger than max-job-size (%d bytes)" // the limit
	errNoSuchClient  = "ERR No such client"
	errClientName    = "ERR Client names cannot contain spaces, newlines or special characters."
)

// errorReply maps an error from the broker or the store to a RESP error.
func errorReply(err error) string {
	var noRepl *queue.NoReplError
	switch {
	case errors.Is(err, queue.ErrNoJob):
		return errNoJob
	case errors.Is(err, queue.ErrTooLate):
		return errTooLate
	case errors.As(err, &noRepl):
		return errNoRepl + ", since I'm unable to hold a copy of the message for the following reason: " + noRepl.Reason
	case errors.Is(err, queue.ErrNoRepl):
		return errNoRepl
	case errors.Is(err, queue.ErrReplTimeout):
		return errReplTimeout
	case errors.Is(err, queue.ErrLeaving):
		return errLeaving
	case errors.Is(err, queue.ErrMaxLen):
		return errMaxLen
	case errors.Is(err, queue.ErrPaused):
		return errPausedIn
	case errors.Is(err, queue.ErrClosed), errors.Is(err, storage.ErrClosed):
		// The server closes its connections before the broker, so a
		// closed broker under a live connection is the daemon swapping
		// in a reopened store after a disk failure: retry shortly.
		return errLoading
	case errors.Is(err, storage.ErrNoSpace):
		// A store opened on a full disk, read-only (before ErrFailed,
		// which wraps it).
		return errNoSpace
	case errors.Is(err, storage.ErrIndexCorrupt):
		// Before ErrFailed, which wraps it once the store has failed.
		return errIndexCorrupt
	case errors.Is(err, storage.ErrFailed):
		return errStoreFailed
	}
	msg := err.Error()
	for _, prefix := range []string{"queue: ", "storage: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return "ERR " + oneLine(msg)
}

// oneLine makes a message safe for a RESP simple error.
func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

// configError maps an error of Options.Config to a RESP error.
func configError(name string, err error) string {
	switch {
	case errors.Is(err, ErrConfigUnknown):
		return fmt.Sprintf("ERR Unknown option or number of arguments for CONFIG SET - '%s'", truncate(name, 64))
	case errors.Is(err, ErrConfigRestart):
		return fmt.Sprintf("ERR CONFIG SET of '%s' needs a restart", name)
	case errors.Is(err, ErrNoConfigFile):
		return "ERR The server is running without a config file"
	case name != "":
		return fmt.Sprintf("ERR CONFIG SET failed (possibly related to argument '%s') - %s", name, oneLine(err.Error()))
	}
	return "ERR " + oneLine(err.Error())
}
