#!/bin/bash
# Start a local 3-node diskque cluster on 127.0.0.1:7711, 7712 and 7713 (bus ports 17711-17713), data in
# ./data/cluster/1..3 (each node's log in its directory, log.txt), and MEET them into one cluster.
# Usage: bench/scripts/cluster.sh [BIN]   (BIN defaults to bin/diskque-server; `make cluster` builds it first)
# Ctrl-C stops the three nodes (SIGTERM). A second run on the same directories rejoins without MEET.
# Needs redis-cli for the MEET and the wait.
set -u
bin=${1:-bin/diskque-server}
command -v redis-cli >/dev/null || { echo "cluster.sh: redis-cli is needed (Debian: apt-get install redis-tools)"; exit 1; }
ports=(7711 7712 7713)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait; exit 0' INT TERM
for i in 0 1 2; do
  d=./data/cluster/$((i + 1)); mkdir -p "$d"
  "$bin" --port "${ports[$i]}" --bind 127.0.0.1 --dir "$d" --logfile log.txt &
  pids+=($!)
done
for p in "${ports[@]}"; do
  for _ in $(seq 300); do redis-cli -p "$p" info persistence 2>/dev/null | grep -q '^loading:0' && break; sleep 0.1; done
done
redis-cli -p 7711 cluster meet 127.0.0.1 7712 || exit 1
redis-cli -p 7712 cluster meet 127.0.0.1 7713 || exit 1
for _ in $(seq 300); do
  n=0
  for p in "${ports[@]}"; do redis-cli -p "$p" cluster info | grep -q 'cluster_reachable_nodes:2' && n=$((n + 1)); done
  [ "$n" = 3 ] && break
  sleep 0.1
done
redis-cli -p 7711 cluster nodes
echo "3 nodes on 127.0.0.1:7711-7713 (logs in ./data/cluster/N/log.txt); Ctrl-C stops them"
wait
