#!/bin/bash
# per-job-counts.sh OLD_BIN NEW_BIN [MODES] [REPS]: getack1 (as single-ab.sh: 100k queued jobs, 50 connections,
# GETJOB NOHANG COUNT 1 then ACKJOB) on two diskque-server builds, alternating, a fresh server each run, and
# per job consumed: the server's read and write syscalls (/proc/PID/io syscr, syscw: sockets and the AOF),
# its AOF fsyncs (/metrics diskque_aof_fsyncs_total), its context switches (every thread's
# voluntary + involuntary, /proc/PID/task/*/status) and its CPU (user+system). Counts, unlike wall-clock
# throughput, hardly move with the machine's load. QBENCH: the qbench binary (built from ../shared/peers/qbench).
# WORKLOAD=add1 counts per ADDJOB instead (redis-benchmark, 50 clients, pipeline 1, N ADDJOBs, default 100000,
# as single-ab.sh's add1). Besides the counts, the server's threads' involuntary switches are not told apart.
set -u
old=$1 new=$2 modes=${3:-"everysec always"} reps=${4:-2}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); pid=
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
qbench=${QBENCH:-}
if [ -z "$qbench" ]; then
  (cd "$here/../../../shared/peers/qbench" && go build -o "$work/qbench" .) || exit 1
  qbench=$work/qbench
fi
jobs=100000
workload=${WORKLOAD:-getack1}
[ "$workload" = add1 ] && jobs=${N:-100000}
body=$(head -c 100 /dev/zero | tr '\0' x)
freeport() { python3 -c '
import socket,random
while True:
    p=random.randint(21000,29000)
    try:
        for q in (p,p+10000,p+1):
            s=socket.socket(); s.bind(("127.0.0.1",q)); s.close()
        print(p); break
    except OSError: pass'; } # the cluster bus takes port + 10000, the metrics port + 1
snap() { # syscr syscw fsyncs ctxsw cputicks
  local r w f c t
  r=$(awk '/^syscr/{print $2}' /proc/$pid/io); w=$(awk '/^syscw/{print $2}' /proc/$pid/io)
  f=$(curl -s http://127.0.0.1:$((p+1))/metrics | awk '/^diskque_aof_fsyncs_total/{print $2}')
  c=$(cat /proc/$pid/task/*/status 2>/dev/null | awk '/ctxt_switches/{s+=$2} END{print s}')
  t=$(awk '{print $14+$15}' /proc/$pid/stat)
  echo "$r $w $f $c $t"
}
for mode in $modes; do
  for r in $(seq $reps); do
    for b in old new; do
      bin=$old; [ $b = new ] && bin=$new
      p=$(freeport)
      d=$work/d$r$b; mkdir -p $d
      "$bin" --port $p --dir $d --appendonly yes --appendfsync $mode --metrics-addr 127.0.0.1:$((p+1)) >$d.log 2>&1 &
      pid=$!
      for i in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q "^loading:0" && break; sleep 0.05; done
      if [ "$workload" = add1 ]; then
        s0=$(snap)
        rate=$(redis-benchmark -p $p -c 50 -n $jobs -P 1 --csv ADDJOB q "$body" 0 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"' | cut -d. -f1)
        s1=$(snap)
      else
        "$qbench" -size 100 -addr 127.0.0.1:$p -mode add -n $jobs -conns 4 -pipeline 64 >/dev/null
        s0=$(snap)
        rate=$("$qbench" -size 100 -addr 127.0.0.1:$p -mode getack -count 1 -conns 50 | sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p')
        s1=$(snap)
      fi
      echo "$s0 $s1" | awk -v b=$b -v m=$mode -v n=$jobs -v rate=$rate '{printf "%-8s %-3s jobs/s %6d  per job: reads %.2f writes %.2f fsyncs %.3f ctxsw %.2f cpu-us %.1f\n", m, b, rate, ($6-$1)/n, ($7-$2)/n, ($8-$3)/n, ($9-$4)/n, ($10-$5)*10000/n}'
      kill $pid; wait $pid 2>/dev/null; pid=; rm -rf $d
    done
  done
done
