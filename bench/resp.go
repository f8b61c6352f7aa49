package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// ErrProtocol is returned (wrapped) by Reader.Read when the server sends
// bytes that are not RESP2: an unknown type byte, a missing CRLF, a bad
// length, or arrays nested deeper than maxDepth.
var ErrProtocol = errors.New("bench: protocol error")

// Kind is a RESP2 reply type, named by its leading byte.
type Kind byte

// The five RESP2 reply types.
const (
	KindSimple Kind = '+' // simple string: Value.Str
	KindError  Kind = '-' // error: Value.Str is the message without the '-'
	KindInt    Kind = ':' // integer: Value.Int
	KindBulk   Kind = '$' // bulk string: Value.Str, or Value.Null for $-1
	KindArray  Kind = '*' // array: Value.Array, or Value.Null for *-1
)

// Value is one decoded RESP2 reply.
type Value struct {
	Kind  Kind
	Str   string  // KindSimple, KindError, KindBulk
	Int   int64   // KindInt
	Array []Value // KindArray
	Null  bool    // $-1 or *-1
}

// String renders v compactly for error messages and tests.
func (v Value) String() string {
	switch v.Kind {
	case KindSimple:
		return "+" + v.Str
	case KindError:
		return "-" + v.Str
	case KindInt:
		return ":" + strconv.FormatInt(v.Int, 10)
	case KindBulk:
		if v.Null {
			return "$nil"
		}
		return strconv.Quote(v.Str)
	case KindArray:
		if v.Null {
			return "*nil"
		}
		s := "["
		for i, e := range v.Array {
			if i > 0 {
				s += " "
			}
			s += e.String()
		}
		return s + "]"
	}
	return fmt.Sprintf("?%q", byte(v.Kind))
}

// Limits the Reader enforces so that garbage cannot make it allocate
// without bound or recurse forever.
const (
	maxDepth     = 32
	maxBulkLen   = 512 << 20
	maxArrayLen  = 1 << 24
	readerBufLen = 64 << 10
)

// Reader decodes RESP2 replies from a stream. It is not safe for
// concurrent use.
type Reader struct {
	br      *bufio.Reader
	scratch []byte
}

// NewReader returns a Reader with a 64 KiB buffer over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, readerBufLen)}
}

// newReaderSize is NewReader with a chosen buffer size (tests use tiny
// buffers to exercise lines longer than the buffer).
func newReaderSize(r io.Reader, size int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, size)}
}

// Buffered reports how many bytes are already read from the connection
// but not yet decoded.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// Read decodes the next reply. A stream that ends inside a reply gives
// io.ErrUnexpectedEOF; one that ends between replies gives io.EOF.
func (r *Reader) Read() (Value, error) {
	return r.read(0)
}

func (r *Reader) read(depth int) (Value, error) {
	line, err := r.line()
	if err != nil {
		if depth > 0 && err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Value{}, err
	}
	if len(line) == 0 {
		return Value{}, fmt.Errorf("%w: empty line", ErrProtocol)
	}
	kind, rest := Kind(line[0]), line[1:]
	switch kind {
	case KindSimple, KindError:
		return Value{Kind: kind, Str: string(rest)}, nil
	case KindInt:
		n, err := parseInt(rest)
		if err != nil {
			return Value{}, err
		}
		return Value{Kind: KindInt, Int: n}, nil
	case KindBulk:
		n, err := parseInt(rest)
		if err != nil {
			return Value{}, err
		}
		if n == -1 {
			return Value{Kind: KindBulk, Null: true}, nil
		}
		if n < 0 || n > maxBulkLen {
			return Value{}, fmt.Errorf("%w: bulk length %d", ErrProtocol, n)
		}
		if cap(r.scratch) < int(n)+2 {
			r.scratch = make([]byte, int(n)+2)
		}
		b := r.scratch[:n+2]
		if _, err := io.ReadFull(r.br, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Value{}, err
		}
		if b[n] != '\r' || b[n+1] != '\n' {
			return Value{}, fmt.Errorf("%w: bulk string of %d bytes not followed by CRLF", ErrProtocol, n)
		}
		return Value{Kind: KindBulk, Str: string(b[:n])}, nil
	case KindArray:
		n, err := parseInt(rest)
		if err != nil {
			return Value{}, err
		}
		if n == -1 {
			return Value{Kind: KindArray, Null: true}, nil
		}
		if n < 0 || n > maxArrayLen {
			return Value{}, fmt.Errorf("%w: array length %d", ErrProtocol, n)
		}
		if depth >= maxDepth {
			return Value{}, fmt.Errorf("%w: arrays nested deeper than %d", ErrProtocol, maxDepth)
		}
		elems := make([]Value, n)
		for i := range elems {
			if elems[i], err = r.read(depth + 1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return Value{}, err
			}
		}
		return Value{Kind: KindArray, Array: elems}, nil
	}
	return Value{}, fmt.Errorf("%w: unexpected type byte %q", ErrProtocol, line[0])
}

// line returns the next line without its CRLF. The slice is valid until
// the next read.
func (r *Reader) line() ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// A line longer than the buffer (a long simple string or error):
		// collect it in scratch.
		buf := append(r.scratch[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = r.br.ReadSlice('\n')
			buf = append(buf, line...)
		}
		r.scratch = buf
		line = buf
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: line not terminated by CRLF", ErrProtocol)
	}
	return line[:len(line)-2], nil
}

// parseInt parses a RESP integer: an optional '-' and decimal digits.
func parseInt(b []byte) (int64, error) {
	orig := b
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, fmt.Errorf("%w: bad integer %q", ErrProtocol, orig)
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: bad integer %q", ErrProtocol, orig)
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, fmt.Errorf("%w: integer %q overflows int64", ErrProtocol, orig)
		}
		n = n*10 + d
	}
	if neg {
		n = -n
	}
	return n, nil
}

// Writer encodes commands as RESP2 arrays of bulk strings into a buffer
// and sends the buffer with one Write call on Flush, so a pipeline of
// commands leaves in as few packets as the kernel likes. It is not safe
// for concurrent use.
//
// A command is Array(n) followed by exactly n Bulk/BulkString calls.
type Writer struct {
	w   io.Writer
	buf []byte
}

// NewWriter returns a Writer that sends to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, buf: make([]byte, 0, 4096)}
}

// Array starts a command of n arguments.
func (w *Writer) Array(n int) {
	w.buf = append(w.buf, '*')
	w.buf = strconv.AppendInt(w.buf, int64(n), 10)
	w.buf = append(w.buf, '\r', '\n')
}

// Bulk appends one argument.
func (w *Writer) Bulk(b []byte) {
	w.buf = append(w.buf, '$')
	w.buf = strconv.AppendInt(w.buf, int64(len(b)), 10)
	w.buf = append(w.buf, '\r', '\n')
	w.buf = append(w.buf, b...)
	w.buf = append(w.buf, '\r', '\n')
}

// BulkString appends one argument.
func (w *Writer) BulkString(s string) {
	w.buf = append(w.buf, '$')
	w.buf = strconv.AppendInt(w.buf, int64(len(s)), 10)
	w.buf = append(w.buf, '\r', '\n')
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, '\r', '\n')
}

// BulkInt appends one integer argument in decimal.
func (w *Writer) BulkInt(n int) {
	var tmp [20]byte
	w.Bulk(strconv.AppendInt(tmp[:0], int64(n), 10))
}

// Command appends a whole command whose arguments are all strings.
func (w *Writer) Command(args ...string) {
	w.Array(len(args))
	for _, a := range args {
		w.BulkString(a)
	}
}

// Buffered is the number of bytes waiting for Flush.
func (w *Writer) Buffered() int { return len(w.buf) }

// Flush sends everything buffered in one Write and empties the buffer.
func (w *Writer) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}
