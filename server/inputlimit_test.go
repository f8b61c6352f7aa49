package server

import (
	"fmt"
	"strings"
	"testing"
)

// TestRespScanner feeds request streams whole and a byte at a time: valid
// pipelines pass, each limit stops the stream where it is crossed, and
// malformed input is left to redcon.
func TestRespScanner(t *testing.T) {
	cmd := func(args ...string) string {
		s := fmt.Sprintf("*%d\r\n", len(args))
		for _, a := range args {
			s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
		}
		return s
	}
	body := strings.Repeat("b", 1000)
	for _, tc := range []struct {
		name   string
		in     string
		noAuth bool
		want   string
	}{
		{"pipeline", cmd("ADDJOB", "q", body, "0") + cmd("PING") + "PING\r\n" + cmd("GETJOB", "FROM", "q"), false, ""},
		{"empty and null arrays", "*0\r\n*-1\r\n" + cmd("PING"), false, ""},
		{"bulk at the limit", cmd("ADDJOB", "q", strings.Repeat("x", 2000), "0"), false, ""},
		{"bulk over the limit", "*2\r\n$4\r\nPING\r\n$2001\r\n", false, errBulkLen},
		{"absurd bulk", "*1\r\n$99999999999999999999999\r\n", false, errBulkLen},
		{"too many arguments", "*101\r\n", false, errMultibulkLen},
		{"arguments at the limit", cmd(strings.Split(strings.Repeat("a ", 100), " ")[:100]...), false, ""},
		{"inline line too long", strings.Repeat("a", maxInline+1), false, errInlineTooBig},
		{"inline lines", strings.Repeat(strings.Repeat("a", 1000)+"\r\n", 100), false, ""},
		{"before AUTH: AUTH passes", cmd("AUTH", "secret") + cmd("HELLO", "2", "AUTH", "default", "pw"), true, ""},
		{"before AUTH: 11 arguments", "*11\r\n", true, errNoAuthMultibulkLen},
		{"before AUTH: a large bulk", "*2\r\n$4\r\nAUTH\r\n$16385\r\n", true, errNoAuthBulkLen},
		{"garbage resyncs", "*x\r\n$$$\r\n" + cmd("PING") + "*999\r\n", false, errMultibulkLen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			maxBulk, args := int64(2000), int64(100)
			if tc.noAuth {
				maxBulk, args = maxBulkNoAuth, maxArgsNoAuth
			}
			var whole respScanner
			if got := whole.feed([]byte(tc.in), maxBulk, args, tc.noAuth); got != tc.want {
				t.Errorf("whole: %q, want %q", got, tc.want)
			}
			var bytewise respScanner
			got := ""
			for i := 0; i < len(tc.in) && got == ""; i++ {
				got = bytewise.feed([]byte{tc.in[i]}, maxBulk, args, tc.noAuth)
			}
			if got != tc.want {
				t.Errorf("byte at a time: %q, want %q", got, tc.want)
			}
			if tc.want != "" {
				return
			}
			// What redcon reads is the stream itself, '$' lines held back
			// only until they are whole.
			lim := scanLimits{maxBulk: maxBulk, maxArgs: args, noAuth: tc.noAuth}
			var sc respScanner
			if out, _, _, _ := sc.scan([]byte(tc.in), nil, lim); string(out) != tc.in {
				t.Errorf("whole: passed on %q", out)
			}
			sc = respScanner{}
			var out []byte
			for i := 0; i < len(tc.in); i++ {
				out, _, _, _ = sc.scan([]byte{tc.in[i]}, out, lim)
			}
			if string(out) != tc.in {
				t.Errorf("byte at a time: passed on %q", out)
			}
		})
	}
}

// TestInputLimits over TCP: an announced bulk past max-job-size ends the
// connection with Redis's protocol error before the bytes are sent; a body
// a little over max-job-size still gets ADDJOB's own error; before AUTH the
// limits are Redis's small ones; other clients are not affected.
func TestInputLimits(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{RequirePass: "pw"})
	s.SetBroker(newBroker(t))
	s.SetMaxJobSize(64 << 10)

	other := dialResp(t, addr)
	if got := other.do("AUTH pw"); got != "+OK" {
		t.Fatal(got)
	}

	noAuth := dialResp(t, addr)
	noAuth.send("*11\r\n")
	if got := noAuth.read(); got != "-"+errNoAuthMultibulkLen {
		t.Errorf("11 arguments before AUTH: %q", got)
	}
	if !noAuth.closedByServer() {
		t.Error("connection still open after a protocol error")
	}
	noAuth = dialResp(t, addr)
	noAuth.send("*2\r\n$4\r\nAUTH\r\n$100000\r\n")
	if got := noAuth.read(); got != "-"+errNoAuthBulkLen {
		t.Errorf("100 kB bulk before AUTH: %q", got)
	}

	c := dialResp(t, addr)
	if got := c.do("AUTH pw"); got != "+OK" {
		t.Fatal(got)
	}
	// A little over max-job-size: read, and refused by ADDJOB itself.
	if got := c.doArgs("ADDJOB", "q", strings.Repeat("x", 64<<10+1), "0"); !strings.HasPrefix(got, "-ERR job body is larger than max-job-size") {
		t.Errorf("ADDJOB just over max-job-size: %q", got)
	}
	// After AUTH, 20 kB is an ordinary body.
	if got := c.doArgs("ADDJOB", "q", strings.Repeat("x", 20<<10), "0"); !strings.HasPrefix(got, "+D-") {
		t.Errorf("ADDJOB of 20 kB after AUTH: %q", got)
	}
	// Announcing a 1 GB body: refused at once, nothing of it sent.
	c.send("*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$1000000000\r\n")
	if got := c.read(); got != "-"+errBulkLen {
		t.Errorf("1 GB bulk: %q", got)
	}
	if !c.closedByServer() {
		t.Error("connection still open after announcing a 1 GB bulk")
	}
	c = dialResp(t, addr)
	c.do("AUTH pw")
	c.send(fmt.Sprintf("*%d\r\n", maxArgs+1))
	if got := c.read(); got != "-"+errMultibulkLen {
		t.Errorf("%d arguments: %q", maxArgs+1, got)
	}
	if got := other.do("QLEN q"); got != ":1" {
		t.Errorf("the other client: QLEN q = %q", got)
	}
}
