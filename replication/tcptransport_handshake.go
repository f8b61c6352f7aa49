package replication

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// The handshake of a bus link (doc.go "Handshake"). The dialler D has
// already sent KindBus; then:
//
//	D → A  hello:  "DQB1" | flags | idLen | id(D) | nonce(D)[32]
//	A → D  reply:  status | idLen | id(A) | nonce(A)[32] | mac(A)[32]?
//	D → A  proof:  status | mac(D)[32]?
//	A → D  final:  status
//
// flags bit 0: D has a cluster secret. A status other than handshakeOK is
// followed by reasonLen | reason and ends the handshake. With a secret,
//
//	mac(A) = HMAC-SHA256(secret, "diskque bus acceptor\x00" | transcript)
//	mac(D) = HMAC-SHA256(secret, "diskque bus dialler\x00"  | transcript)
//	transcript = nonce(D) | nonce(A) | idLen | id(D) | idLen | id(A)
//
// so each side proves it knows the secret over nonces the other chose
// (fresh from crypto/rand), with distinct labels so that a proof cannot be
// reflected back, and both ids bound in. The acceptor proves itself first;
// the dialler checks that proof (and that A is the node it meant to reach)
// before sending its own.
const (
	handshakeMagic    = "DQB1"
	handshakeNonceLen = 32
	handshakeMACLen   = sha256.Size

	helloHasSecret byte = 1 << 0

	handshakeOK      byte = 0
	handshakeRefused byte = 1

	// maxNodeIDLen bounds a node id on the wire (ours are 40 hex chars).
	maxNodeIDLen = 64
)

// errHandshake wraps every handshake failure; errRefused those where a
// side refused the other (wrong secret, wrong node), which are logged as
// warnings, not as network noise.
var (
	errHandshake = errors.New("replication: bus handshake failed")
	errRefused   = errors.New("replication: bus handshake refused")
)

// validBusPeerID says whether id may name a node on the bus: 1 to 64
// printable ASCII characters, no spaces. (validNodeID on branch ctransport:
// renamed where it met membership's stricter validNodeID, 40 hex.)
func validBusPeerID(id string) bool {
	if id == "" || len(id) > maxNodeIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

func newNonce() ([]byte, error) {
	n := make([]byte, handshakeNonceLen)
	if _, err := rand.Read(n); err != nil {
		return nil, fmt.Errorf("%w: nonce: %v", errHandshake, err)
	}
	return n, nil
}

// handshakeMAC is one side's proof; label tells the sides apart.
func handshakeMAC(secret, label string, nonceD, nonceA []byte, idD, idA string) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(nonceD)
	h.Write(nonceA)
	h.Write([]byte{byte(len(idD))})
	h.Write([]byte(idD))
	h.Write([]byte{byte(len(idA))})
	h.Write([]byte(idA))
	return h.Sum(nil)
}

const (
	labelAcceptor = "diskque bus acceptor"
	labelDialler  = "diskque bus dialler"
)

// readStatus reads a status byte; a refusal returns errRefused with the
// peer's reason.
func readStatus(r io.Reader) error {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("%w: %v", errHandshake, err)
	}
	if b[0] == handshakeOK {
		return nil
	}
	reason, err := readShortString(r)
	if err != nil {
		return fmt.Errorf("%w by the peer (no reason: %v)", errRefused, err)
	}
	return fmt.Errorf("%w by the peer: %s", errRefused, reason)
}

// refusal encodes a refused status with its reason.
func refusal(reason string) []byte {
	if len(reason) > 255 {
		reason = reason[:255]
	}
	return append([]byte{handshakeRefused, byte(len(reason))}, reason...)
}

func readShortString(r io.Reader) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// readNodeID reads idLen | id and checks the id.
func readNodeID(r io.Reader) (string, error) {
	id, err := readShortString(r)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	if !validBusPeerID(id) {
		return "", fmt.Errorf("%w: invalid node id %q", errHandshake, id)
	}
	return id, nil
}

// dialHandshake runs the dialler's side on rw (KindBus already sent, or
// sent as prefix's first byte): it says it is myID, checks that the
// acceptor is wantID (when not "") and, with a secret, that it knows it.
// It returns the acceptor's id.
func dialHandshake(rw io.ReadWriter, prefix []byte, myID, wantID, secret string) (string, error) {
	nonceD, err := newNonce()
	if err != nil {
		return "", err
	}
	hello := append(prefix, handshakeMagic...)
	var flags byte
	if secret != "" {
		flags |= helloHasSecret
	}
	hello = append(hello, flags, byte(len(myID)))
	hello = append(hello, myID...)
	hello = append(hello, nonceD...)
	if _, err := rw.Write(hello); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	if err := readStatus(rw); err != nil {
		return "", err
	}
	peerID, err := readNodeID(rw)
	if err != nil {
		return "", err
	}
	nonceA := make([]byte, handshakeNonceLen)
	if _, err := io.ReadFull(rw, nonceA); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	refuse := func(reason string) (string, error) {
		rw.Write(refusal(reason)) // best effort: the peer logs it
		return "", fmt.Errorf("%w: %s", errRefused, reason)
	}
	if secret != "" {
		macA := make([]byte, handshakeMACLen)
		if _, err := io.ReadFull(rw, macA); err != nil {
			return "", fmt.Errorf("%w: %v", errHandshake, err)
		}
		if !hmac.Equal(macA, handshakeMAC(secret, labelAcceptor, nonceD, nonceA, myID, peerID)) {
			return refuse("the acceptor's proof does not match our cluster-secret (wrong cluster-secret)")
		}
	}
	if wantID != "" && peerID != wantID {
		return refuse(fmt.Sprintf("dialled node %s but reached node %s", wantID, peerID))
	}
	proof := []byte{handshakeOK}
	if secret != "" {
		proof = append(proof, handshakeMAC(secret, labelDialler, nonceD, nonceA, myID, peerID)...)
	}
	if _, err := rw.Write(proof); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	if err := readStatus(rw); err != nil {
		return "", err
	}
	return peerID, nil
}

// acceptHandshake runs the acceptor's side on rw (KindBus already read by
// the PortMux). It returns the dialler's id once the dialler proved it
// knows the secret (when there is one).
func acceptHandshake(rw io.ReadWriter, myID, secret string) (string, error) {
	var magic [len(handshakeMagic) + 1]byte
	if _, err := io.ReadFull(rw, magic[:]); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	if string(magic[:len(handshakeMagic)]) != handshakeMagic {
		return "", fmt.Errorf("%w: not a diskque bus hello (magic %q)", errHandshake, magic[:len(handshakeMagic)])
	}
	flags := magic[len(handshakeMagic)]
	peerID, err := readNodeID(rw)
	if err != nil {
		return "", err
	}
	nonceD := make([]byte, handshakeNonceLen)
	if _, err := io.ReadFull(rw, nonceD); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	refuse := func(reason string) (string, error) {
		rw.Write(refusal(reason))
		return "", fmt.Errorf("%w: node %s: %s", errRefused, peerID, reason)
	}
	switch hasSecret := flags&helloHasSecret != 0; {
	case flags&^helloHasSecret != 0:
		return refuse(fmt.Sprintf("unknown hello flags %#x", flags))
	case secret != "" && !hasSecret:
		return refuse("this node requires a cluster-secret and the dialler has none")
	case secret == "" && hasSecret:
		return refuse("the dialler has a cluster-secret and this node has none")
	case peerID == myID:
		return refuse("the dialler has this node's own id " + myID)
	}
	nonceA, err := newNonce()
	if err != nil {
		return "", err
	}
	reply := append([]byte{handshakeOK, byte(len(myID))}, myID...)
	reply = append(reply, nonceA...)
	if secret != "" {
		reply = append(reply, handshakeMAC(secret, labelAcceptor, nonceD, nonceA, peerID, myID)...)
	}
	if _, err := rw.Write(reply); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	if err := readStatus(rw); err != nil {
		return "", fmt.Errorf("node %s: %w", peerID, err)
	}
	if secret != "" {
		macD := make([]byte, handshakeMACLen)
		if _, err := io.ReadFull(rw, macD); err != nil {
			return "", fmt.Errorf("%w: %v", errHandshake, err)
		}
		if !hmac.Equal(macD, handshakeMAC(secret, labelDialler, nonceD, nonceA, peerID, myID)) {
			return refuse("the dialler's proof does not match our cluster-secret (wrong cluster-secret)")
		}
	}
	if _, err := rw.Write([]byte{handshakeOK}); err != nil {
		return "", fmt.Errorf("%w: %v", errHandshake, err)
	}
	return peerID, nil
}
