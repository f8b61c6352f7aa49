// Package leakcheck finds goroutines that tests leave running: a store's
// checkpoint loop, a broker's timer loop or a collector whose Close was
// never called (or returned before its goroutine did), a connection handler
// still blocked. A leak is a goroutine that did not exist when the check
// started and still exists once the test is over.
//
// Goroutines stop a little after the Close that tells them to, so a check
// polls (up to Timeout) rather than looking once.
//
// Check is for one test, Main for a whole package (TestMain). Check sees
// every goroutine of the process, so it must not be used by a test that runs
// in parallel with others (t.Parallel): their goroutines would look leaked.
// Main runs after every test has ended, so it suits any package.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Timeout is how long a check waits for goroutines to end before it calls
// them leaked. Generous: a loaded 2-core machine under -race is slow to
// schedule the goroutines a Close released.
var Timeout = 10 * time.Second

// ignored are functions whose goroutines the runtime or the standard
// library start once and keep for the life of the process.
var ignored = []string{
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime.ReadTrace",
	"testing.(*T).Run",
	"testing.tRunner",
	"testing.(*M).",
	"testing.runTests",
}

// goroutine is one goroutine of a stack dump.
type goroutine struct {
	id    uint64
	stack string // the dump's paragraph for it, header line included
}

// snapshot returns every goroutine but the caller's.
func snapshot() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	// The dump starts with the caller's goroutine.
	for i, par := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 {
			continue
		}
		g, ok := parse(string(par))
		if ok {
			out = append(out, g)
		}
	}
	return out
}

// parse reads one paragraph of a dump: "goroutine 17 [chan receive]:\n…".
func parse(par string) (goroutine, bool) {
	header, _, _ := strings.Cut(par, "\n")
	rest, ok := strings.CutPrefix(header, "goroutine ")
	if !ok {
		return goroutine{}, false
	}
	idText, _, _ := strings.Cut(rest, " ")
	id, err := strconv.ParseUint(idText, 10, 64)
	if err != nil {
		return goroutine{}, false
	}
	return goroutine{id: id, stack: par}, true
}

// benign reports whether g is a goroutine of the runtime or of the testing
// package, not of the code under test.
func (g goroutine) benign() bool {
	for _, f := range ignored {
		if strings.Contains(g.stack, "\n"+f) {
			return true
		}
	}
	return false
}

// Baseline is the set of goroutines running when a check started.
type Baseline map[uint64]bool

// Take records the goroutines running now.
func Take() Baseline {
	b := Baseline{}
	for _, g := range snapshot() {
		b[g.id] = true
	}
	return b
}

// Leaked waits up to Timeout for every goroutine started since b to end and
// returns the stacks of those that did not (nil if none).
func (b Baseline) Leaked() []string {
	deadline := time.Now().Add(Timeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		var leaked []string
		for _, g := range snapshot() {
			if !b[g.id] && !g.benign() {
				leaked = append(leaked, g.stack)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			slices.Sort(leaked)
			return leaked
		}
		// Polling, not synchronisation: nothing else tells us when a
		// goroutine we do not own has returned.
		time.Sleep(delay)
	}
}

// Check fails t if goroutines started during the test are still running
// after it, once its later-registered cleanups (which close what it
// opened) have run. Call it first in the test.
func Check(t testing.TB) {
	t.Helper()
	b := Take()
	t.Cleanup(func() {
		if leaked := b.Leaked(); len(leaked) > 0 {
			t.Errorf("leakcheck: %d goroutines still running after the test:\n\n%s",
				len(leaked), strings.Join(leaked, "\n\n"))
		}
	})
}

// Main runs the package's tests and then fails the run if any goroutine
// they started is still running. Use it as TestMain's body, or call it
// where TestMain would call m.Run; it returns the exit code.
func Main(m *testing.M) int {
	b := Take()
	code := m.Run()
	if code != 0 {
		return code // the failures say more than a leak would
	}
	if leaked := b.Leaked(); len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "leakcheck: %d goroutines still running after the tests:\n\n%s\n",
			len(leaked), strings.Join(leaked, "\n\n"))
		return 1
	}
	return 0
}
