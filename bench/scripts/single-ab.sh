#!/bin/bash
# single-ab.sh OLD_BIN NEW_BIN [MODES] [REPS]: a single node's pipeline-1 and pipeline-16 workloads, two
# diskque-server builds side by side — alternating runs, a fresh server and data directory each run, the
# load generators of shared/peers/vs-disque.sh (redis-benchmark for ADDJOB, qbench for GETJOB+ACKJOB).
#   MODES: a subset of "memory everysec always" (default "everysec always"); REPS: runs per build (3).
#   WORKLOADS="add1 getack1 add16 add1c1" picks workloads (add1c1: one client, pipeline 1, N1 ADDJOBs;
#   getack1b: getack1 with GETJOB TIMEOUT 2000; mixed: as vs-disque.sh); N sets the ADDJOB count (200000); QBENCH the qbench binary
#   (default: built from ../shared/peers/qbench beside the repository).
#   PROF=DIR saves a 5 s CPU profile of each run's server in DIR (the server gets --metrics-addr).
# Prints, per (workload, mode, build), the median ops/s and the median server CPU (user+system from /proc,
# the measured phase only) in µs per operation, then every run.
set -u
old=$1 new=$2 modes=${3:-"everysec always"} reps=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); pid=
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
qbench=${QBENCH:-}
if [ -z "$qbench" ]; then
  (cd "$here/../../../shared/peers/qbench" && go build -o "$work/qbench" .) || exit 1
  qbench=$work/qbench
fi
body=$(head -c ${BODY:-100} /dev/zero | tr '\0' x)
freeport() { python3 -c '
import socket,random
while True:
    p=random.randint(21000,29000)
    try:
        for q in (p,p+10000,p+1):
            s=socket.socket(); s.bind(("127.0.0.1",q)); s.close()
        print(p); break
    except OSError: pass'; }
start() { # bin mode -> pid, p
  p=$(freeport); d="$work/data/d$RANDOM$RANDOM"; mkdir -p "$d"
  local extra=(); [ -n "${PROF:-}" ] && extra=(--metrics-addr 127.0.0.1:$((p+1)) --pprof yes)
  case $2 in
    memory) "$1" --port $p --dir "$d" --appendonly no "${extra[@]}" >"$d.log" 2>&1 & ;;
    *) "$1" --port $p --dir "$d" --appendonly yes --appendfsync $2 "${extra[@]}" >"$d.log" 2>&1 & ;;
  esac
  pid=$!
  for i in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q "^loading:0" && return 0; sleep 0.05; done
  echo "start failed $1 $2" >&2; return 1
}
stop() { kill $pid 2>/dev/null; wait $pid 2>/dev/null; pid=; rm -rf "$work"/data; }
cpu() { awk '{print $14+$15}' /proc/$pid/stat; } # clock ticks (1/100 s)
rate() { sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p'; }
prep_getack1() { "$qbench" -size ${BODY:-100} -addr 127.0.0.1:$p -mode add -n 100000 -conns 4 -pipeline 64 >/dev/null; }
ops_getack1() { echo 100000; }
w_getack1() { "$qbench" -size ${BODY:-100} -addr 127.0.0.1:$p -mode getack -count 1 -conns 50 | rate; }
prep_getack1b() { prep_getack1; }
ops_getack1b() { echo 100000; }
w_getack1b() { # getack1 with a blocking GETJOB (TIMEOUT 2000 instead of NOHANG): jobs are always ready
  "$qbench" -size ${BODY:-100} -addr 127.0.0.1:$p -mode getack -count 1 -conns 50 -timeout 2000 -n 100000 | rate; }
ops_add1() { echo ${N:-200000}; }
w_add1() { redis-benchmark -p $p -c 50 -n ${N:-200000} -P 1 --csv ADDJOB q "$body" 0 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
ops_add1c1() { echo ${N1:-20000}; } # one client: a command's latency, hand-offs and all
w_add1c1() { redis-benchmark -p $p -c 1 -n ${N1:-20000} -P 1 --csv ADDJOB q "$body" 0 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
ops_add16() { echo ${N:-200000}; }
w_add16() { redis-benchmark -p $p -c 50 -n ${N:-200000} -P 16 --csv ADDJOB q "$body" 0 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
prep_mixed() { :; }
ops_mixed() { echo 400000; }
w_mixed() { # 8 producers (pipeline 16) and 4 consumers (GETJOB TIMEOUT COUNT 100 + ACKJOB) at once
  "$qbench" -size ${BODY:-100} -addr 127.0.0.1:$p -mode add -n 400000 -conns 8 -pipeline 16 >/dev/null &
  local pp=$!
  "$qbench" -size ${BODY:-100} -addr 127.0.0.1:$p -mode getack -count 100 -conns 4 -timeout 2000 -n 400000 | rate
  wait $pp; }
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for w in ${WORKLOADS:-add1 getack1 add16}; do
  for mode in $modes; do
    for b in old new; do : >"$work/$b.ops"; : >"$work/$b.cpu"; done
    for r in $(seq $reps); do
      for b in old new; do
        bin=$old; [ $b = new ] && bin=$new
        start "$bin" $mode || continue
        declare -F prep_$w >/dev/null && prep_$w
        cp=
        if [ -n "${PROF:-}" ]; then
          curl -s -o "$PROF/$w-$mode-$b-$r.prof" "http://127.0.0.1:$((p+1))/debug/pprof/profile?seconds=5" &
          cp=$!
        fi
        c0=$(cpu); o=$(w_$w); c1=$(cpu)
        [ -n "$cp" ] && wait $cp # not a bare wait: that would wait for the server too
        echo "$o" >>"$work/$b.ops"
        awk -v a=$c0 -v b=$c1 -v n=$(ops_$w) 'BEGIN{printf "%.1f\n", (b-a)*10000/n}' >>"$work/$b.cpu"
        stop
      done
    done
    for b in old new; do
      printf '%-8s %-8s %-3s ops/s %8.0f  cpu-us/op %5s   [%s| %s]\n' $w $mode $b "$(median <"$work/$b.ops")" \
        "$(median <"$work/$b.cpu")" "$(tr '\n' ' ' <"$work/$b.ops")" "$(tr '\n' ' ' <"$work/$b.cpu")"
    done
  done
done
