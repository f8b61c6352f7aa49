#!/bin/bash
# Replicated ADDJOB on 3 local diskque nodes (AOF on), for profiling and for old/new comparisons in one session.
#   cluster-ab.sh run BIN MODE PIPELINE REPLICATE [PROFILE_SECONDS]
#       start 3 nodes of BIN (appendfsync MODE, pprof on), MEET them, run redis-benchmark (50 clients, 100 B bodies,
#       N ADDJOBs, default 100000) against node 0 and print its ops/s. With PROFILE_SECONDS, 2 s into the run it
#       saves a CPU profile (PROF=trace: an execution trace) of node 0 (origin.prof) and node 1 (replica.prof) in
#       OUT (default .). EXTRA=ASYNC adds ASYNC to every ADDJOB.
#   cluster-ab.sh ab OLD NEW MODE PIPELINE REPLICATE REPS [N]
#       REPS runs of each build, alternating, and the medians' ratio (new/old).
#   CPU=1 (either mode) also prints, on stderr, each run's CPU time per ADDJOB (user+system, µs) of the
#   origin and of the two replicas: on a machine other work loads, a steadier figure than the ops/s.
#   INFO=1 prints the origin's INFO cluster after the run (messages and jobs sent: REPLJOB batching).
#   MALLOCS=1 (either mode) prints, on stderr, each run's heap allocations per ADDJOB of the three nodes (Go's
#   go_memstats_mallocs_total from their metrics endpoints, before and after): a count the load does not move.
set -u
. "$(dirname "$0")/cluster-lib.sh"
cmd=$1; shift
run() {
  local bin=$1 mode=$2 pipe=$3 repl=$4 secs=${5:-0} out=${OUT:-.}
  local work; work=$(mktemp -d); local pids=() c1= c2=
  trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"' RETURN
  local b; b=$(free_base 10000 100)
  local P=($b $((b+1)) $((b+2)))
  for i in 0 1 2; do mkdir -p "$work/n$i"
    "$bin" --port ${P[$i]} --dir "$work/n$i" --bind 127.0.0.1 --appendonly yes --appendfsync $mode \
      --pprof yes --metrics-addr 127.0.0.1:$((b+100+i)) >"$work/n$i.log" 2>&1 &
    pids+=($!)
  done
  wait_loaded "${P[@]}"
  meet3 "${P[@]}" || echo "cluster did not form" >&2
  local body; body=$(head -c 100 /dev/zero | tr '\0' x)
  if [ "$secs" != 0 ]; then
    (sleep 2; curl -s -o "$out/origin.prof" "http://127.0.0.1:$((b+100))/debug/pprof/${PROF:-profile}?seconds=$secs") & c1=$!
    (sleep 2; curl -s -o "$out/replica.prof" "http://127.0.0.1:$((b+101))/debug/pprof/${PROF:-profile}?seconds=$secs") & c2=$!
  fi
  cpu() { local t=0; for p in "${pids[@]}"; do t="$t $(awk '{print $14+$15}' /proc/$p/stat)"; done; echo $t; }
  mallocs() { local t=; for i in 0 1 2; do t="$t $(curl -s http://127.0.0.1:$((b+100+i))/metrics |
    awk '$1=="go_memstats_mallocs_total"{printf "%.0f", $2}')"; done; echo $t; }
  local mbefore=; [ -n "${MALLOCS:-}" ] && mbefore=$(mallocs)
  local before; before=$(cpu)
  redis-benchmark -p ${P[0]} -c 50 -n ${N:-100000} -P $pipe --csv ADDJOB q "$body" 0 REPLICATE $repl ${EXTRA:-} 2>/dev/null |
    tail -1 | cut -d, -f2 | tr -d '"'
  [ -n "${INFO:-}" ] && redis-cli -p ${P[0]} info cluster >&2
  if [ -n "${CPU:-}" ]; then
    echo "$before $(cpu)" | awk -v n=${N:-100000} -v hz=$(getconf CLK_TCK) -v bin="$bin" \
      '{printf "cpu us/job %s: origin %.1f replicas %.1f %.1f\n", bin, ($6-$2)*1e6/hz/n, ($7-$3)*1e6/hz/n, ($8-$4)*1e6/hz/n}' >&2
  fi
  if [ -n "${MALLOCS:-}" ]; then
    echo "$mbefore $(mallocs)" | awk -v n=${N:-100000} -v bin="$bin" \
      '{printf "allocs/job %s: origin %.1f replicas %.1f %.1f\n", bin, ($4-$1)/n, ($5-$2)/n, ($6-$3)/n}' >&2
  fi
  [ -n "$c1" ] && wait $c1 $c2
  return 0
}
median() { sort -g | awk '{x[NR]=$1} END{print x[int((NR+1)/2)]}'; }
case $cmd in
run) run "$@" ;;
ab)
  old=$1 new=$2 mode=$3 pipe=$4 repl=$5 reps=$6; export N=${7:-${N:-60000}}; a=(); b=()
  for r in $(seq $reps); do a+=($(run $old $mode $pipe $repl)); b+=($(run $new $mode $pipe $repl)); done
  ma=$(printf '%s\n' "${a[@]}" | median); mb=$(printf '%s\n' "${b[@]}" | median)
  echo "REPLICATE $repl P$pipe $mode ${EXTRA:-}: old $ma new $mb ratio $(echo $ma $mb | awk '{printf "%.2f", $2/$1}')  [old: ${a[*]} | new: ${b[*]}]" ;;
*) echo "usage: cluster-ab.sh run|ab ..."; exit 2 ;;
esac
