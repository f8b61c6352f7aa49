package replication

// PENDING (branch cserver): NodeInfo as the membership API gives it (part M,
// branch cmember, declares it in its membership files). This copy lets the
// server's cluster commands build before cmember lands; it is deleted when
// cmember is merged into cserver.

// NodeInfo is one node as membership knows it.
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
