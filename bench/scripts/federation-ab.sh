#!/bin/bash
# The federation drain (20k jobs added on node A with REPLICATE 1, consumed from node B by one client looping
# GETJOB TIMEOUT 2000 COUNT 100 + ACKJOB) on 3 local nodes, for old/new comparisons of diskque builds in one session.
#   federation-ab.sh ab OLD NEW MODE REPS     REPS runs of each build, alternating (ABBA); the medians and their ratio (new/old)
#   federation-ab.sh run BIN MODE [PROFILE_SECONDS]
#       one run; with PROFILE_SECONDS, 0.3 s into the drain it saves CPU profiles (PROF=trace: execution traces) of
#       A (giver.prof) and B (asker.prof) in OUT (default .).
# MODE is the appendfsync policy (everysec|always). QBENCH overrides the client (default: built from
# ../shared/peers/qbench). N sets the job count (default 20000).
# LOCAL=R adds the jobs on B itself with REPLICATE R instead (no federation: the ceiling of consuming on B jobs
# that R nodes hold; LOCAL=2 is the two-copy case every federated job is).
# CPU=1 also prints, on stderr, each run's CPU time per consumed job (user+system from /proc, µs) of A, B and C.
set -u
. "$(dirname "$0")/cluster-lib.sh"
cmd=$1; shift
peers=$(cd "$(dirname "$0")/../../../shared/peers" && pwd)
if [ -z "${QBENCH:-}" ]; then QBENCH=$(mktemp); (cd "$peers/qbench" && go build -o "$QBENCH" .) || exit 1; fi
run() {
  local bin=$1 mode=$2 secs=${3:-0} out=${OUT:-.} n=${N:-20000}
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
  if [ -n "${LOCAL:-}" ]; then
    "$QBENCH" -addr 127.0.0.1:${P[1]} -mode add -n $n -conns 4 -pipeline 64 -extra "REPLICATE $LOCAL" >/dev/null
  else
    "$QBENCH" -addr 127.0.0.1:${P[0]} -mode add -n $n -conns 4 -pipeline 64 -extra "REPLICATE 1" >/dev/null
  fi
  cpu() { local t=0; for p in "${pids[@]}"; do t="$t $(awk '{print $14+$15}' /proc/$p/stat)"; done; echo $t; }
  local before; before=$(cpu)
  if [ "$secs" != 0 ]; then
    (sleep 0.3; curl -s -o "$out/giver.prof" "http://127.0.0.1:$((b+100))/debug/pprof/${PROF:-profile}?seconds=$secs") & c1=$!
    (sleep 0.3; curl -s -o "$out/asker.prof" "http://127.0.0.1:$((b+101))/debug/pprof/${PROF:-profile}?seconds=$secs") & c2=$!
  fi
  "$QBENCH" -addr 127.0.0.1:${P[1]} -mode getack -count 100 -conns 1 -timeout 2000 -n $n | sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p'
  [ -n "${INFO:-}" ] && redis-cli -p ${P[1]} info cluster >&2
  if [ -n "${CPU:-}" ]; then
    # what the collection still does after the last reply counts too: wait until B has no job left
    local k; for k in $(seq 100); do [ "$(redis-cli -p ${P[1]} info jobs | sed -n 's/^registered_jobs:\([0-9]*\).*/\1/p')" = 0 ] && break; sleep 0.05; done
    echo "$before $(cpu)" | awk -v n=$n -v hz=$(getconf CLK_TCK) -v bin="$bin" \
      '{printf "cpu us/job %s: A %.1f B %.1f C %.1f\n", bin, ($6-$2)*1e6/hz/n, ($7-$3)*1e6/hz/n, ($8-$4)*1e6/hz/n}' >&2
  fi
  [ -n "$c1" ] && wait $c1 $c2
  return 0
}
median() { sort -g | awk '{x[NR]=$1} END{print x[int((NR+1)/2)]}'; }
case $cmd in
run) run "$@" ;;
ab)
  old=$1 new=$2 mode=$3 reps=$4; a=(); b=()
  # The order alternates (old-new, new-old, …): the second run of a pair did worse often enough to bias a ratio.
  for r in $(seq $reps); do
    if [ $((r % 2)) = 1 ]; then a+=($(run "$old" $mode)); b+=($(run "$new" $mode))
    else b+=($(run "$new" $mode)); a+=($(run "$old" $mode)); fi
  done
  ma=$(printf '%s\n' "${a[@]}" | median); mb=$(printf '%s\n' "${b[@]}" | median)
  printf 'federation drain %s: old %s new %s ratio %.2f   [old: %s | new: %s]\n' $mode "$ma" "$mb" \
    "$(echo "$ma $mb" | awk '{print ($1>0)?$2/$1:0}')" "${a[*]}" "${b[*]}" ;;
*) echo "usage: $0 ab OLD NEW MODE REPS | run BIN MODE [PROFILE_SECONDS]" >&2; exit 2 ;;
esac
