package replication

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/s2"
)

// encodeFrames frames msgs as a link's writer would.
func encodeFrames(t testing.TB, compressAbove int, msgs ...Message) []byte {
	t.Helper()
	var buf bytes.Buffer
	fw := &frameWriter{w: bufio.NewWriter(&buf), compressAbove: compressAbove}
	for _, m := range msgs {
		if _, err := fw.writeFrame(m.Type, m.Payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := fw.w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decodeAll reads frames until the first error.
func decodeAll(data []byte, maxFrame int) ([]Message, error) {
	fr := &frameReader{r: bytes.NewReader(data), maxFrame: maxFrame}
	var out []Message
	for {
		m, _, err := fr.readFrame()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, m)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	msgs := []Message{
		{Type: MsgReplJob, Payload: nil},
		{Type: MsgGotJob, Payload: []byte("x")},
		{Type: MsgSetAck, Payload: bytes.Repeat([]byte("ab"), 1000)}, // compressed
		{Type: MsgEnqueue, Payload: bytes.Repeat([]byte{0}, 257)},
	}
	data := encodeFrames(t, 256, msgs...)
	if len(data) > 1000 {
		t.Fatalf("%d bytes on the wire: the large payloads were not compressed", len(data))
	}
	got, err := decodeAll(data, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("decoded %d messages, want %d", len(got), len(msgs))
	}
	for i := range msgs {
		if got[i].Type != msgs[i].Type || !bytes.Equal(got[i].Payload, msgs[i].Payload) {
			t.Fatalf("message %d changed in the round trip", i)
		}
	}
	// Every truncation but at a frame boundary is a malformed frame; a
	// truncation at a boundary is a clean end.
	for n := range len(data) {
		_, err := decodeAll(data[:n], 1<<20)
		if err != nil && !errors.Is(err, errMalformedFrame) {
			t.Fatalf("truncated at %d: %v is not errMalformedFrame", n, err)
		}
	}
	// Every single bit flipped is caught (by the checksum or a field
	// check), or decodes to what was sent: never to something else.
	for i := range data {
		for bit := range 8 {
			bad := bytes.Clone(data)
			bad[i] ^= 1 << bit
			got, err := decodeAll(bad, 1<<20)
			if err == nil {
				t.Fatalf("flipping bit %d of byte %d went unnoticed (%d messages)", bit, i, len(got))
			}
		}
	}
}

// FuzzFrameDecode feeds arbitrary bytes to the frame decoder: it must never
// panic, never return a payload over the limit, and what it accepts must
// re-encode and decode to the same messages.
func FuzzFrameDecode(f *testing.F) {
	valid := encodeFrames(f, 256,
		Message{Type: MsgReplJob, Payload: []byte("a job")},
		Message{Type: MsgSetAck, Payload: bytes.Repeat([]byte("compress me "), 40)})
	f.Add(valid)
	f.Add(valid[:len(valid)-3])
	f.Add(encodeFrames(f, 0, Message{Type: MsgGotJob, Payload: make([]byte, 300)}))
	f.Add(rawFrame(MsgReplJob, frameCompressed, []byte{0xff, 0xff, 0xff, 0x7f}, nil))
	f.Add(rawFrame(0, 0, nil, nil))
	f.Add(rawFrame(MsgReplJob, 0x02, []byte("x"), nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 0})
	f.Add([]byte{})
	f.Add(append([]byte{byte(MsgReplJob), frameCompressed}, s2.Encode(nil, bytes.Repeat([]byte("z"), 5000))...))
	f.Add(append([]byte{byte(MsgReplJob), frameCompressed}, s2.Encode(nil, []byte("a short body"))...))
	const maxFrame = 4096
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data, maxFrame)
		// The checksum stops most random input at once: also decode the
		// input as one frame's type, flags and body under a valid checksum,
		// so that the field checks and the s2 decoder see arbitrary bytes.
		if len(data) >= 2 {
			checkDecode(t, rawFrame(MsgType(data[0]), data[1], data[2:], nil), maxFrame)
		}
	})
}

func checkDecode(t *testing.T, data []byte, maxFrame int) {
	got, err := decodeAll(data, maxFrame)
	if err != nil && !errors.Is(err, errMalformedFrame) {
		t.Fatalf("a decoding error that is not errMalformedFrame: %v", err)
	}
	for _, m := range got {
		if len(m.Payload) > maxFrame || m.Type == 0 {
			t.Fatalf("accepted a %d-byte payload of type %d", len(m.Payload), m.Type)
		}
	}
	again, err := decodeAll(encodeFrames(t, 256, got...), maxFrame)
	if err != nil || len(again) != len(got) {
		t.Fatalf("re-encoded messages do not decode: %v", err)
	}
	for i := range got {
		if again[i].Type != got[i].Type || !bytes.Equal(again[i].Payload, got[i].Payload) {
			t.Fatalf("message %d changed when re-encoded", i)
		}
	}
}
