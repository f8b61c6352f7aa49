package replication

// NodeInfo is one node as membership knows it. This is the declaration of
// the membership API every part codes against (part M's membership.go has
// the same one): delete this file when the two branches merge.
type NodeInfo struct {
	ID                     string // 40 lower-case hex
	ClientAddr             string // "ip:port" of the client port (CLUSTER NODES, HELLO)
	BusAddr                string // "ip:port" of the bus port
	Myself                 bool
	Suspect                bool // "fail?": memberlist suspects it
	Failed                 bool // "fail": memberlist declared it dead
	Leaving                bool
	PingSentMs, PongRecvMs int64 // Unix ms, 0 = none (CLUSTER NODES)
}
