package main

// Partitions for the Jepsen checker: the cluster starts behind a
// faultproxy.Net (startPartCluster: each node on its own loopback address,
// its bus behind a proxy), and the partition nemesis splits off one or two
// nodes and heals through it, beside the kill nemesis.

import (
	"testing"

	"github.com/diskque/diskque/internal/faultproxy"
	"github.com/diskque/diskque/internal/jepsen"
)

func init() {
	// flags: startPartCluster's nodes keep the defaults, appendonly yes
	// among them (the only flag the checker passes).
	jepsenNetwork = func(t *testing.T, n int, flags ...string) (*procCluster, jepsen.Partitioner) {
		pc := startPartCluster(t, n)
		return pc.procCluster, proxyPartitioner{pc.net}
	}
}

// proxyPartitioner is a jepsen.Partitioner over a faultproxy.Net.
type proxyPartitioner struct{ net *faultproxy.Net }

func (p proxyPartitioner) Partition(groups [][]int) error {
	p.net.Partition(groups...)
	return nil
}

func (p proxyPartitioner) Heal() error {
	p.net.HealAll()
	return nil
}
