#!/bin/bash
# Cross-node latency: producers on node A of a 3-node cluster add jobs at a steady rate (REPLICATE 1), consumers on
# node B take them (blocking GETJOB COUNT 100 + ACKJOB; federation moves every job), diskque beside Disque 1.0 on this
# machine, alternating runs. Per run, bench/crosslat prints the jobs/s consumed and the latency from each job's ADDJOB
# reply to the GETJOB reply that delivered it (p50/p90/p99/max); the script adds the CPU time (user+system, µs) per
# job consumed of node A and node B.
# Usage: bench/scripts/cross-latency.sh [CHECKOUT] [everysec|always|memory] [RATE] [SECONDS] [reps]
# DISQUE_BIN overrides the reference server (default: built once by build-disque.sh). CROSSLAT_FLAGS adds flags
# (e.g. "-producers 2 -consumers 2 -count 10"; "-prime=false" for the old start, where the first broadcast NEEDJOBS
# finds the producers' node empty and the backlog of its first seconds is measured). BASE_BIN, a diskque-server
# binary, adds a third server to each rep (printed as "base"), for an A/B of two builds beside Disque.
set -u
. "$(dirname "$0")/cluster-lib.sh"
checkout=${1:-.}; mode=${2:-everysec}; rate=${3:-2000}; secs=${4:-10}; reps=${5:-1}
here=$(cd "$(dirname "$0")/../../../shared/peers" && pwd)   # the shared peers folder beside the checkout
DISQUE_BIN=${DISQUE_BIN:-$("$here/build-disque.sh" | tail -1)}
work=$(mktemp -d); pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"' EXIT
(cd "$checkout" && go build -o "$work/dq" ./cmd/diskque-server && go build -o "$work/crosslat" ./bench/crosslat) || exit 1
# cpu: each node's user+system CPU ticks so far (/proc/PID/stat).
cpu() { local p; for p in "${pids[@]}"; do awk '{printf "%d ", $14+$15}' /proc/$p/stat; done; }
# one: a crosslat run, then the CPU µs per job consumed of the producers' node A and the consumers' node B.
one() {
  local before out; before=$(cpu)
  out=$("$work/crosslat" -produce 127.0.0.1:${P[0]} -consume 127.0.0.1:${P[1]} -rate $rate -duration ${secs}s ${CROSSLAT_FLAGS:-})
  echo "$out $(echo "$before $(cpu) $(echo "$out" | sed -n 's/.* consumed=\([0-9]*\).*/\1/p')" |
    awk -v hz=$(getconf CLK_TCK) '{printf "cpu_us_per_job A=%.1f B=%.1f", ($4-$1)*1e6/hz/$7, ($5-$2)*1e6/hz/$7}')"
}
for r in $(seq $reps); do
  up "$work/dq" && echo "diskque $mode $(one)"; down
  if [ -n "${BASE_BIN:-}" ]; then up "$BASE_BIN" && echo "base    $mode $(one)"; down; fi
  up "$DISQUE_BIN" && echo "disque  $mode $(one)"; down
done
