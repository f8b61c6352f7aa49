#!/usr/bin/env bash
# GLOBALQLEN's cost on 3 local nodes beside QLEN's: requests/s and latency from redis-benchmark on
# node 0, and CPU-µs per request on each server process (user+system from /proc).
#
#   bench/scripts/globalqlen.sh BINARY [REQUESTS] [CLIENTS]
set -euo pipefail
bin=$(readlink -f "$1"); n=${2:-20000}; clients=${3:-8}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cluster-lib.sh"
work=$(mktemp -d); trap 'kill ${pids[*]} 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
base=$(free_base 10000)
pids=()
for i in 0 1 2; do
  p=$((base + i))
  "$bin" --port $p --dir "$work/n$i" --appendfsync everysec >"$work/n$i.log" 2>&1 &
  pids+=($!)
done
wait_loaded $base $((base + 1)) $((base + 2))
meet3 $base $((base + 1)) $((base + 2)) || { echo "no mesh" >&2; exit 1; }
for i in 0 1 2; do
  for k in $(seq 100); do echo "ADDJOB q body 0 REPLICATE 1"; done | redis-cli -p $((base + i)) >/dev/null
done
echo "GLOBALQLEN q on node 0: $(redis-cli -p $base globalqlen q) (want 300)"
ticks=$(getconf CLK_TCK)
cpu() { for p in "${pids[@]}"; do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd' '; }
for cmd in QLEN GLOBALQLEN; do
  before=($(cpu))
  out=$(redis-benchmark -p $base -c $clients -n $n -q $cmd q 2>&1 | tr '\r' '\n' | grep -E 'requests per second' | tail -1)
  after=($(cpu))
  per=""
  for i in 0 1 2; do per="$per $(( (after[i] - before[i]) * 1000000 / ticks / n ))"; done
  echo "$cmd: $out; CPU-µs per request, nodes 0 1 2:$per"
done
