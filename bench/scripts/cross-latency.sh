#!/bin/bash
# Cross-node latency: producers on node A of a 3-node cluster add jobs at a steady rate (REPLICATE 1), consumers on
# node B take them (blocking GETJOB COUNT 100 + ACKJOB; federation moves every job), diskque beside Disque 1.0 on this
# machine, alternating runs. Per run, bench/crosslat prints the jobs/s consumed and the latency from each job's ADDJOB
# reply to the GETJOB reply that delivered it (p50/p90/p99/max).
# Usage: bench/scripts/cross-latency.sh [CHECKOUT] [everysec|always|memory] [RATE] [SECONDS] [reps]
# DISQUE_BIN overrides the reference server (default: built once by build-disque.sh). CROSSLAT_FLAGS adds flags
# (e.g. "-producers 2 -consumers 2 -count 10").
set -u
checkout=${1:-.}; mode=${2:-everysec}; rate=${3:-2000}; secs=${4:-10}; reps=${5:-1}
here=$(cd "$(dirname "$0")/../../../shared/peers" && pwd)   # the shared peers folder beside the checkout
DISQUE_BIN=${DISQUE_BIN:-$("$here/build-disque.sh" | tail -1)}
work=$(mktemp -d); pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"' EXIT
(cd "$checkout" && go build -o "$work/dq" ./cmd/diskque-server && go build -o "$work/crosslat" ./bench/crosslat) || exit 1
base() { python3 -c '
import socket,random
while True:
    p=random.randint(21000,29000)
    try:
        for q in (p,p+1,p+2,p+10000,p+10001,p+10002):
            s=socket.socket(); s.bind(("127.0.0.1",q)); s.close()
        print(p); break
    except OSError: pass'; }
up() { # BIN: start 3 nodes, meet, wait
  local bin=$1; pids=(); b=$(base); P=($b $((b+1)) $((b+2)))
  for i in 0 1 2; do
    d="$work/data/n$i"; mkdir -p "$d"
    case $mode in
      memory) "$bin" --port ${P[$i]} --dir "$d" --bind 127.0.0.1 --appendonly no >"$d.log" 2>&1 & ;;
      *) "$bin" --port ${P[$i]} --dir "$d" --bind 127.0.0.1 --appendonly yes --appendfsync $mode >"$d.log" 2>&1 & ;;
    esac
    pids+=($!)
  done
  for p in "${P[@]}"; do
    for k in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q '^loading:0' && break; sleep 0.05; done
  done
  redis-cli -p ${P[0]} cluster meet 127.0.0.1 ${P[1]} >/dev/null
  redis-cli -p ${P[1]} cluster meet 127.0.0.1 ${P[2]} >/dev/null
  for k in $(seq 300); do
    n=0; for p in "${P[@]}"; do redis-cli -p $p cluster info 2>/dev/null | grep -q 'cluster_reachable_nodes:2' && n=$((n+1)); done
    [ $n = 3 ] && return 0; sleep 0.1
  done
  echo "cluster did not form"; return 1
}
down() { for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; pids=(); rm -rf "$work/data"; }
one() { "$work/crosslat" -produce 127.0.0.1:${P[0]} -consume 127.0.0.1:${P[1]} -rate $rate -duration ${secs}s ${CROSSLAT_FLAGS:-}; }
for r in $(seq $reps); do
  up "$work/dq" && echo "diskque $mode $(one)"; down
  up "$DISQUE_BIN" && echo "disque  $mode $(one)"; down
done
