package bench

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReaderValues(t *testing.T) {
	id1 := "D-0a1b2c3d-" + strings.Repeat("A", 24) + "-0001"
	id2 := "D-0a1b2c3d-" + strings.Repeat("b", 24) + "-0001"
	for _, tc := range []struct {
		name string
		in   string
		want []string // Value.String of each reply, in order
	}{
		{"simple string", "+OK\r\n", []string{"+OK"}},
		{"empty simple string", "+\r\n", []string{"+"}},
		{"job id", "+" + id1 + "\r\n", []string{"+" + id1}},
		{"error", "-ERR unknown command 'FOO'\r\n", []string{"-ERR unknown command 'FOO'"}},
		{"error code", "-BADID Invalid Job ID format.\r\n", []string{"-BADID Invalid Job ID format."}},
		{"integer", ":42\r\n", []string{":42"}},
		{"negative integer", ":-7\r\n", []string{":-7"}},
		{"zero", ":0\r\n", []string{":0"}},
		{"19-digit ctime", ":1700000000123456789\r\n", []string{":1700000000123456789"}},
		{"max int64", ":9223372036854775807\r\n", []string{":9223372036854775807"}},
		{"bulk", "$5\r\nhello\r\n", []string{`"hello"`}},
		{"empty bulk", "$0\r\n\r\n", []string{`""`}},
		{"bulk with CRLF inside", "$4\r\na\r\nb\r\n", []string{`"a\r\nb"`}},
		{"null bulk", "$-1\r\n", []string{"$nil"}},
		{"array", "*3\r\n:1\r\n+two\r\n$5\r\nthree\r\n", []string{`[:1 +two "three"]`}},
		{"empty array", "*0\r\n", []string{"[]"}},
		{"null array", "*-1\r\n", []string{"*nil"}},
		{"array with nulls", "*2\r\n$-1\r\n*-1\r\n", []string{"[$nil *nil]"}},
		{
			"getjob reply",
			"*2\r\n" +
				"*3\r\n$1\r\nq\r\n$40\r\n" + id1 + "\r\n$4\r\nbody\r\n" +
				"*3\r\n$1\r\nq\r\n$40\r\n" + id2 + "\r\n$0\r\n\r\n",
			[]string{`[["q" "` + id1 + `" "body"] ["q" "` + id2 + `" ""]]`},
		},
		{
			"getjob withcounters",
			"*1\r\n*7\r\n$1\r\nq\r\n$40\r\n" + id1 + "\r\n$1\r\nx\r\n$5\r\nnacks\r\n:0\r\n$21\r\nadditional-deliveries\r\n:2\r\n",
			[]string{`[["q" "` + id1 + `" "x" "nacks" :0 "additional-deliveries" :2]]`},
		},
		{"deeply nested", "*1\r\n*1\r\n*1\r\n*0\r\n", []string{"[[[[]]]]"}},
		{
			"pipelined replies",
			"+" + id1 + "\r\n-NOREPL Timeout\r\n*-1\r\n:3\r\n",
			[]string{"+" + id1, "-NOREPL Timeout", "*nil", ":3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Tiny buffers too: lines and bulks longer than the buffer.
			for _, size := range []int{16, readerBufLen} {
				r := newReaderSize(strings.NewReader(tc.in), size)
				for i, want := range tc.want {
					v, err := r.Read()
					if err != nil {
						t.Fatalf("buffer %d: reply %d: %v", size, i, err)
					}
					if got := v.String(); got != want {
						t.Fatalf("buffer %d: reply %d = %s, want %s", size, i, got, want)
					}
				}
				if v, err := r.Read(); err != io.EOF {
					t.Fatalf("buffer %d: after the last reply: %v, %v; want io.EOF", size, v, err)
				}
			}
		})
	}
}

func TestReaderFields(t *testing.T) {
	r := NewReader(strings.NewReader("*2\r\n$-1\r\n*-1\r\n:-12\r\n-ERR x\r\n"))
	v, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if v.Kind != KindArray || v.Null || len(v.Array) != 2 {
		t.Fatalf("array: %+v", v)
	}
	if e := v.Array[0]; e.Kind != KindBulk || !e.Null {
		t.Fatalf("null bulk: %+v", e)
	}
	if e := v.Array[1]; e.Kind != KindArray || !e.Null || e.Array != nil {
		t.Fatalf("null array: %+v", e)
	}
	if v, _ = r.Read(); v.Kind != KindInt || v.Int != -12 {
		t.Fatalf("integer: %+v", v)
	}
	if v, _ = r.Read(); v.Kind != KindError || v.Str != "ERR x" {
		t.Fatalf("error: %+v", v)
	}
}

func TestReaderMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want error
	}{
		{"unknown type", "!oops\r\n", ErrProtocol},
		{"bare LF", "+OK\n", ErrProtocol},
		{"empty line", "\r\n", ErrProtocol},
		{"bad integer", ":12a\r\n", ErrProtocol},
		{"integer past int64", ":9223372036854775808\r\n", ErrProtocol},
		{"20-digit integer", ":12345678901234567890\r\n", ErrProtocol},
		{"lone minus", ":-\r\n", ErrProtocol},
		{"empty integer", ":\r\n", ErrProtocol},
		{"integer too long", ":1234567890123456789012\r\n", ErrProtocol},
		{"bad bulk length", "$x\r\nab\r\n", ErrProtocol},
		{"negative bulk length", "$-2\r\n", ErrProtocol},
		{"bulk without CRLF", "$2\r\nabcd\r\n", ErrProtocol},
		{"negative array length", "*-3\r\n", ErrProtocol},
		{"too deep", strings.Repeat("*1\r\n", maxDepth+1) + ":1\r\n", ErrProtocol},
		{"truncated line", "+OK", io.ErrUnexpectedEOF},
		{"truncated bulk", "$10\r\nabc", io.ErrUnexpectedEOF},
		{"truncated array", "*3\r\n:1\r\n", io.ErrUnexpectedEOF},
		{"truncated nested array", "*2\r\n*2\r\n:1\r\n", io.ErrUnexpectedEOF},
		{"nothing", "", io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewReader(strings.NewReader(tc.in)).Read()
			if !errors.Is(err, tc.want) {
				t.Fatalf("Read(%q) error = %v, want %v", tc.in, err, tc.want)
			}
		})
	}
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Array(4)
	w.BulkString("ADDJOB")
	w.BulkString("q")
	w.Bulk([]byte("a\r\nb"))
	w.BulkInt(0)
	w.Command("GETJOB", "NOHANG", "COUNT", "16", "FROM", "q")
	w.Command("PING")
	w.Array(1)
	w.Bulk(nil)
	if buf.Len() != 0 {
		t.Fatalf("wrote %d bytes before Flush", buf.Len())
	}
	if w.Buffered() == 0 {
		t.Fatal("Buffered() = 0 before Flush")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := "*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$4\r\na\r\nb\r\n$1\r\n0\r\n" +
		"*6\r\n$6\r\nGETJOB\r\n$6\r\nNOHANG\r\n$5\r\nCOUNT\r\n$2\r\n16\r\n$4\r\nFROM\r\n$1\r\nq\r\n" +
		"*1\r\n$4\r\nPING\r\n" +
		"*1\r\n$0\r\n\r\n"
	if got := buf.String(); got != want {
		t.Fatalf("wrote\n%q\nwant\n%q", got, want)
	}
	if w.Buffered() != 0 {
		t.Fatalf("Buffered() = %d after Flush", w.Buffered())
	}
	if err := w.Flush(); err != nil || buf.Len() != len(want) {
		t.Fatalf("empty Flush: %v, %d bytes", err, buf.Len())
	}
}

// TestWriterOneWritePerFlush: a pipeline leaves in a single Write call.
func TestWriterOneWritePerFlush(t *testing.T) {
	var cw countingWriter
	w := NewWriter(&cw)
	for range 16 {
		w.Command("RPOP", "q")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if cw.writes != 1 {
		t.Fatalf("Flush made %d writes, want 1", cw.writes)
	}
}

type countingWriter struct{ writes int }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return len(p), nil
}

// TestRoundTrip: what the Writer encodes, the Reader decodes (a server
// echoing commands back as arrays).
func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	body := bytes.Repeat([]byte{0, '\r', '\n', 0xff}, 1000)
	w.Array(3)
	w.BulkString("LPUSH")
	w.BulkString("q")
	w.Bulk(body)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	v, err := newReaderSize(&buf, 16).Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Array) != 3 || v.Array[0].Str != "LPUSH" || v.Array[1].Str != "q" || v.Array[2].Str != string(body) {
		t.Fatalf("round trip: %.80v", v)
	}
}
