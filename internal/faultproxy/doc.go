// Package faultproxy is a TCP fault proxy for tests: it stands in front of
// a listener on 127.0.0.1/8 and can cut, black-hole, delay and heal the
// connections coming from chosen source addresses, and says what it did.
// It exists for the cluster's partition tests (cmd/diskque-server
// cluster_partition_test.go) and the Jepsen-style checker; nothing in the
// daemon imports it.
//
// # How it tells nodes apart
//
// Linux routes all of 127.0.0.0/8 to the loopback interface, so each node
// of a test cluster gets an address of its own (node i: 127.0.0.(2+i))
// and binds everything to it: its client port, its bus port and the
// source of its outgoing bus and gossip connections (diskque-server's
// bind; bind-source-addr says the same explicitly). Node i's bus is fronted by a
// proxy on i's IP, and i announces the proxy's port to its peers
// (cluster-announce-bus-port), so every connection any peer makes to i's
// bus goes through i's proxy, which reads the peer from the connection's
// source IP. Nothing of the bus protocol is parsed.
//
//	node j ──(src 127.0.0.j+2)──▶ proxy of i (127.0.0.i+2:P) ──▶ bus of i (127.0.0.i+2:B)
//
// # Faults
//
// A Proxy applies a Rule per source IP (the zero Rule forwards at once):
//
//   - Reset: open connections from the source are reset (RST, both sides)
//     and new ones are reset as soon as they are accepted (the kernel has
//     completed the handshake by then, so the dialler sees a reset rather
//     than a refusal);
//   - HoldUp / HoldDown: one direction's bytes wait in the proxy (at most
//     chunkQueue × 32 KiB per direction, then the proxy stops reading and
//     the sender's socket buffer fills), released in order when lifted;
//   - Up / Down: latency added to each direction, per chunk, from the time
//     it was read; bytes stay in order.
//
// A Net manages one proxy per node and keeps the faults as matrices
// between node indexes: Cut(a, b) (reset both ways), CutOff(a),
// Partition(groups...), Hold(from, to) (one-way black hole), Delay(a, b, d),
// DelayOneWay(from, to, d), Heal(a, b) and HealAll(). The proxy in front of
// x sees the connections y dials to x, so the bytes y → x are its "up" and
// x → y its "down": a one-way fault holds in both kinds of connection.
// Events lists every change with its time; Stats counts each proxy's
// connections (accepted, refused, reset) and bytes.
//
// # Configuring a node
//
// Node(i) gives IP, BusPort and Proxy; Node.Flags() is
//
//	--bind IP --cluster-bus-port BusPort --cluster-announce-bus-port Proxy.Port()
//
// and the nodes meet at the proxies: CLUSTER MEET IP clientport Proxy.Port().
// A node restarted with the same flags is behind the same proxy. The
// client port is not proxied (clients reach IP:port directly).
//
// # Invariants
//
// Memory is bounded per connection (two queues of chunkQueue chunks); a
// proxy never spins (a failing Accept backs off); Close ends every
// goroutine it started. All methods are safe for concurrent use.
package faultproxy
