#!/bin/bash
# The federation drain row of ../shared/peers/cluster-vs-disque.sh alone: a 3-node cluster, diskque beside Disque
# 1.0 on this machine, alternating runs; 20k jobs added on A (REPLICATE 1), consumed from B (GETJOB TIMEOUT COUNT 100).
# Usage: bench/scripts/federation-vs-disque.sh [CHECKOUT] [everysec|always|memory] [reps]   (CHECKOUT defaults to .)
# DISQUE_BIN overrides the reference server (default: built once by build-disque.sh). N sets the ADDJOB count.
# Prints one line per workload: the medians for diskque and Disque, their ratio, and every run.
set -u
. "$(dirname "$0")/cluster-lib.sh"
checkout=${1:-.}; mode=${2:-everysec}; reps=${3:-3}
here=$(cd "$(dirname "$0")/../../../shared/peers" && pwd)   # the shared peers folder beside the checkout
DISQUE_BIN=${DISQUE_BIN:-$("$here/build-disque.sh" | tail -1)}
work=$(mktemp -d); pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"' EXIT
(cd "$checkout" && go build -o "$work/dq" ./cmd/diskque-server) || exit 1
(cd "$here/qbench" && go build -o "$work/qbench" .) || exit 1
body=$(head -c 100 /dev/zero | tr '\0' x)
rb() { redis-benchmark -p ${P[0]} -c 50 -n ${N:-100000} -P $1 --csv ADDJOB q "$body" 0 $2 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
drain() { "$work/qbench" -addr 127.0.0.1:${P[0]} -mode add -n 20000 -conns 4 -pipeline 64 -extra "REPLICATE 1" >/dev/null
          "$work/qbench" -addr 127.0.0.1:${P[1]} -mode getack -count 100 -conns 1 -timeout 2000 -n 20000 | sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p'; }
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
run() { # name command...
  local name=$1; shift; : >"$work/a"; : >"$work/b"
  for r in $(seq $reps); do
    up "$work/dq" && "$@" >>"$work/a"; down
    up "$DISQUE_BIN" && "$@" >>"$work/b"; down
  done
  a=$(median <"$work/a"); b=$(median <"$work/b")
  printf '%-26s %-8s diskque %8.0f  disque %8.0f  ratio %.2f   [dq: %s| disque: %s]\n' "$name" $mode "${a:-0}" "${b:-0}" \
    "$(echo "${a:-0} ${b:-0}" | awk '{print ($2>0)?$1/$2:0}')" "$(tr '\n' ' ' <"$work/a")" "$(tr '\n' ' ' <"$work/b")"
}
run "federation drain 20k A->B" drain
