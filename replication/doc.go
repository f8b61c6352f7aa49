// Package replication is the cluster: membership and failure detection on
// hashicorp/memberlist, the cluster bus (one port, PortMux, carrying
// memberlist's gossip and the persistent job links of a Transport), and
// Disque's job protocol on top of it (shared/CLUSTER.md).
//
// # Ports
//
// A node listens on its client port and on one bus port. The first byte of
// each connection to the bus port names its protocol (KindBus,
// KindGossipStream, KindGossipPacket); PortMux hands it to the handler for
// that byte and closes connections that name none.
//
// # Transport
//
// Job messages travel over a Transport: per peer, one ordered link, best
// effort (a message for a peer that is down is dropped; the protocol
// retries what matters). The TCP transport and MemNetwork, the in-memory
// one used by in-process clusters, pass one test suite.
package replication
