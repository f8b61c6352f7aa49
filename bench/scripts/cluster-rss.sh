#!/bin/bash
# RSS per node of a 3-node diskque cluster holding N replicated jobs (each node a copy).
#   cluster-rss.sh BIN [N]
# Starts 3 nodes of BIN (AOF on, appendfsync everysec, pprof on) in a temporary directory, MEETs them, adds N
# (default 1000000) ADDJOBs of 100-byte bodies with REPLICATE 3 through node 0 (redis-benchmark: 50 clients,
# pipeline 16), waits until every node holds N jobs, lets it idle 10 s, and prints each node's
# registered_jobs, VmRSS (from /proc) and the Go heap in use (pprof heap profile, with HEAP=DIR saved there as
# nodeI.heap for `go tool pprof`). DETAIL=1 adds RssAnon/RssFile and Go's MemStats; HOLD=S keeps the nodes up S
# seconds more (their pids printed) for a look at /proc.
set -u
. "$(dirname "$0")/cluster-lib.sh"
bin=$1; n=${2:-1000000}
work=$(mktemp -d); pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"' EXIT
b=$(free_base 10000 100)
P=($b $((b+1)) $((b+2)))
for i in 0 1 2; do mkdir -p "$work/n$i"
  "$bin" --port ${P[$i]} --dir "$work/n$i" --bind 127.0.0.1 --appendonly yes --appendfsync everysec \
    --pprof yes --metrics-addr 127.0.0.1:$((b+100+i)) >"$work/n$i.log" 2>&1 &
  pids+=($!)
done
wait_loaded "${P[@]}"
meet3 "${P[@]}" || echo "cluster did not form" >&2
body=$(head -c 100 /dev/zero | tr '\0' x)
start=$(date +%s)
redis-benchmark -p ${P[0]} -c 50 -n $n -P 16 -q ADDJOB q "$body" 0 REPLICATE 3 2>/dev/null | tr "\r" "\n" | tail -1 | sed "s/.*REPLICATE 3: //"
jobs() { redis-cli -p $1 info jobs | tr -d '\r' | sed -n 's/^registered_jobs://p'; }
for p in "${P[@]}"; do for k in $(seq 600); do [ "$(jobs $p)" -ge $n ] 2>/dev/null && break; sleep 0.5; done; done
echo "filled in $(( $(date +%s) - start )) s; idling 10 s"
sleep 10
for i in 0 1 2; do
  rss=$(awk '/^VmRSS/ {print $2}' /proc/${pids[$i]}/status)
  heapf=${HEAP:-$work}/node$i.heap
  curl -s -o "$heapf" "http://127.0.0.1:$((b+100+i))/debug/pprof/heap"
  inuse=$(go tool pprof -sample_index=inuse_space -top "$heapf" 2>/dev/null | sed -n 's/.*of \([0-9.]*[kMG]B\) total.*/\1/p' | head -1)
  echo "node $i: registered_jobs $(jobs ${P[$i]})  VmRSS $((rss / 1024)) MB  Go heap in use ${inuse:-?}"
  if [ -n "${DETAIL:-}" ]; then
    grep -E '^(RssAnon|RssFile|RssShmem)' /proc/${pids[$i]}/status | tr -s ' \t' ' ' | paste -sd' '
    curl -s "http://127.0.0.1:$((b+100+i))/debug/pprof/heap?debug=1" | grep -E '^# (HeapSys|HeapInuse|HeapIdle|HeapReleased|Sys|StackSys|GCSys|OtherSys) ' | paste -sd' '
  fi
done
if [ -n "${HOLD:-}" ]; then echo "pids ${pids[*]}; holding ${HOLD} s"; sleep "$HOLD"; fi
