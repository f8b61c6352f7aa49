package server

import (
	"strconv"
	"strings"

	"github.com/diskque/diskque/storage"
)

// parseInt parses a decimal integer argument the way Redis does: no spaces,
// no '+', no leading zeros games beyond what strconv accepts.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 || b[0] == '+' {
		return 0, false
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	return v, err == nil
}

func is(arg []byte, word string) bool { return strings.EqualFold(string(arg), word) }

// jobIDs validates every id argument first: one malformed id fails the whole
// command and nothing happens (SPEC.md).
func jobIDs(c *call, args [][]byte) ([]string, bool) {
	ids := make([]string, len(args))
	for i, a := range args {
		if !storage.ValidJobID(string(a)) {
			c.conn.WriteError(errBadID)
			return nil, false
		}
		ids[i] = string(a)
	}
	return ids, true
}
