package replication

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/diskque/diskque/storage"
)

// nodeMeta is what a node gossips about itself in memberlist's node
// metadata (at most memberlist.MetaMaxSize bytes):
//
//	dq1 <id> <client ip:port> <bus ip:port> <flags> [<started>]
//
// flags is "-" or a comma list of "leaving" and "reset" (the node is
// resetting itself and is about to leave: peers forget it at once).
// started is when the node's Membership started (Unix ms): a restarted node
// gossips new metadata, so memberlist tells its peers (NotifyUpdate) even
// when nothing else changed, and they count that as a sign of life from the
// node itself (it alone makes its metadata). Without it, a node restarted
// and killed again within a moment stayed "fail?" from its first death on,
// as if it had never come back (Disque's suite, unit 02).
type nodeMeta struct {
	ID, ClientAddr, BusAddr string
	Leaving, Reset          bool
	Started                 int64
}

const metaVersion = "dq1"

func (m nodeMeta) encode() []byte {
	var flags []string
	if m.Leaving {
		flags = append(flags, "leaving")
	}
	if m.Reset {
		flags = append(flags, "reset")
	}
	f := "-"
	if len(flags) > 0 {
		f = strings.Join(flags, ",")
	}
	fields := []string{metaVersion, m.ID, m.ClientAddr, m.BusAddr, f}
	if m.Started > 0 {
		fields = append(fields, strconv.FormatInt(m.Started, 10))
	}
	return []byte(strings.Join(fields, " "))
}

func decodeMeta(b []byte) (nodeMeta, error) {
	if len(b) > memberlist.MetaMaxSize {
		return nodeMeta{}, errors.New("replication: node metadata is too long")
	}
	fields := strings.Split(string(b), " ")
	if len(fields) < 5 || len(fields) > 6 || fields[0] != metaVersion {
		return nodeMeta{}, fmt.Errorf("replication: node metadata %q is not ours", b)
	}
	m := nodeMeta{ID: fields[1], ClientAddr: fields[2], BusAddr: fields[3]}
	if len(fields) == 6 {
		started, err := strconv.ParseInt(fields[5], 10, 64)
		if err != nil || started <= 0 {
			return nodeMeta{}, fmt.Errorf("replication: node metadata has a bad start time %q", fields[5])
		}
		m.Started = started
	}
	if !storage.ValidNodeID(m.ID) {
		return nodeMeta{}, fmt.Errorf("replication: node metadata names a bad id %q", m.ID)
	}
	for _, a := range []string{m.ClientAddr, m.BusAddr} {
		// An ip:port, never a name: a name would be looked up (DNS) on
		// a peer's say-so wherever the address is used.
		if _, err := parsePeerAddr(a); err != nil {
			return nodeMeta{}, fmt.Errorf("replication: node metadata has a bad address %q", a)
		}
	}
	if fields[4] != "-" {
		for _, f := range strings.Split(fields[4], ",") {
			switch f {
			case "leaving":
				m.Leaving = true
			case "reset":
				m.Reset = true
			default:
				// A newer node's flag: ignore it rather than the node.
			}
		}
	}
	return m, nil
}

// gossipKey derives memberlist's AES-256 gossip key from cluster-secret.
// The domain string keeps the key apart from any other use of the secret
// (the bus's HMAC).
func gossipKey(secret string) []byte {
	sum := sha256.Sum256([]byte("diskque cluster gossip key v1\x00" + secret))
	return sum[:]
}

// gossipTimings are memberlist's settings for one cluster-node-timeout T.
//
// A node killed without leaving is suspected by the prober that misses its
// ack (a probe every ProbeInterval; ProbeTimeout for the direct ack, then
// indirect and TCP pings) and declared dead after the suspicion timeout,
// SuspicionMult×ProbeInterval = T (SuspicionMaxTimeoutMult 1: confirmations
// from other nodes do not shorten it). So "fail" comes between T + T/16 and
// about ProbeInterval + ProbeTimeout + T ≈ 1.2 T after the death (×2 on the
// probe for Lifeguard's awareness at worst): inside the cluster contract's
// 2 T. diskque's own "fail?" flag (no answer to our pings, which run every
// ProbeInterval, for SuspectAfter = 7/8 T) comes first. Both are about T
// after the death, as Disque's PFAIL is: a node down for less than the node
// timeout still counts as reachable, so a synchronous ADDJOB picks it and
// its REPLJOB is sent again when it is back (Disque's test suite restarts a
// node and kills it again within about a second, and expects that).
type gossipTimings struct {
	ProbeInterval, ProbeTimeout, GossipInterval time.Duration
	PushPullInterval, TCPTimeout, GossipToDead  time.Duration
	SuspicionMult, SuspicionMaxTimeoutMult      int
	SuspectAfter                                time.Duration
}

func timingsFor(t time.Duration) gossipTimings {
	if t <= 0 {
		t = DefaultNodeTimeout
	}
	probe := max(t/8, 50*time.Millisecond)
	return gossipTimings{
		ProbeInterval:           probe,
		ProbeTimeout:            probe / 2,
		GossipInterval:          clampDuration(probe/2, 20*time.Millisecond, 200*time.Millisecond),
		PushPullInterval:        clampDuration(t/2, time.Second, 30*time.Second),
		TCPTimeout:              clampDuration(t, time.Second, 10*time.Second),
		GossipToDead:            clampDuration(4*t, 10*time.Second, 60*time.Second),
		SuspicionMult:           8,
		SuspicionMaxTimeoutMult: 1,
		SuspectAfter:            7 * t / 8,
	}
}

func clampDuration(d, lo, hi time.Duration) time.Duration {
	return min(max(d, lo), hi)
}

// apply writes the timings into a memberlist config.
func (g gossipTimings) apply(c *memberlist.Config) {
	c.ProbeInterval = g.ProbeInterval
	c.ProbeTimeout = g.ProbeTimeout
	c.GossipInterval = g.GossipInterval
	c.PushPullInterval = g.PushPullInterval
	c.TCPTimeout = g.TCPTimeout
	c.GossipToTheDeadTime = g.GossipToDead
	c.SuspicionMult = g.SuspicionMult
	c.SuspicionMaxTimeoutMult = g.SuspicionMaxTimeoutMult
	// Broadcasts go to more nodes than memberlist's 4×log10(n+1), so a
	// MEET chain's news does not die out before push/pull repairs it.
	c.RetransmitMult = 6
	// Under local load memberlist stretches its probe timeouts by up to
	// this factor (Lifeguard); more would push "fail" past 2 T.
	c.AwarenessMaxMultiplier = 2
}
