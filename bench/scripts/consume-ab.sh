#!/bin/bash
# consume-ab.sh REPS MODE BIN...: alternating runs of vs-disque.sh's consume and mixed workloads (the same
# qbench load) against each diskque-server build, fresh each run; prints jobs/s and the server's CPU-µs per job
# (user+system from /proc, over the consume phase only for consume). MODE: memory, everysec or always.
# WL="consume mixed" picks workloads, N the consume backlog (200000), QB the qbench binary
# (build it: cd ../shared/peers/qbench && go build -o /tmp/qbench .), EXTRA more server flags.
# Each line also has what Pebble flushed, compacted (written) and read for compactions over the measured phase,
# in MB, and its compactions (INFO storage's index_* lines; "-" for a build without them), and the L0 files at the end.
set -u
reps=$1 mode=$2; shift 2
QB=${QB:-/tmp/qbench}
body=$(head -c 100 /dev/zero | tr '\0' x)
hz=$(getconf CLK_TCK)
port() { python3 -c '
import socket,random
while True:
    p=random.randint(21000,29000)
    try:
        for q in (p,p+10000):
            s=socket.socket(); s.bind(("127.0.0.1",q)); s.close()
        print(p); break
    except OSError: pass'; }
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
rate() { sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p'; }
pebble() { redis-cli -p $1 info storage 2>/dev/null | tr -d '\r' | awk -F: '
  $1=="index_flushed_bytes"{f=$2} $1=="index_compacted_bytes"{c=$2} $1=="index_compaction_read_bytes"{r=$2}
  $1=="index_compactions"{n=$2} $1=="index_l0_files"{l=$2}
  END{if(f=="")print "- - - - -"; else print f, c, r, n, l}'; }
pdelta() { echo "$1 $2" | awk '$1=="-"||$6=="-"{print "flushed_mb=- compacted_mb=- compact_read_mb=- compactions=- l0=-"; exit}
  {printf "flushed_mb=%.1f compacted_mb=%.1f compact_read_mb=%.1f compactions=%d l0=%d\n", ($6-$1)/1e6, ($7-$2)/1e6, ($8-$3)/1e6, $9-$4, $10}'; }
for r in $(seq $reps); do
 for bin in "$@"; do
  for w in ${WL:-consume mixed}; do
   p=$(port); d=$(mktemp -d)
   if [ "$mode" = memory ]; then "$bin" --port $p --dir $d --appendonly no ${EXTRA:-} >$d.log 2>&1 &
   else "$bin" --port $p --dir $d --appendonly yes --appendfsync $mode ${EXTRA:-} >$d.log 2>&1 & fi
   pid=$!
   for i in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q "^loading:0" && break; sleep 0.05; done
   if [ $w = consume ]; then
     $QB -size 100 -addr 127.0.0.1:$p -mode add -n ${N:-200000} -conns 4 -pipeline 64 >/dev/null
     s0=$(pebble $p); c0=$(cpu $pid); t0=$(date +%s.%N)
     rt=$($QB -size 100 -addr 127.0.0.1:$p -mode getack -count 100 -conns 4 | rate)
     c1=$(cpu $pid); s1=$(pebble $p); n=${N:-200000}
   else
     s0=$(pebble $p); c0=$(cpu $pid)
     $QB -size 100 -addr 127.0.0.1:$p -mode add -n 400000 -conns 8 -pipeline 16 > $d.mp &
     pp=$!
     rt=$($QB -size 100 -addr 127.0.0.1:$p -mode getack -count 100 -conns 4 -timeout 2000 -n 400000 | rate)
     wait $pp; c1=$(cpu $pid); s1=$(pebble $p); n=400000
   fi
   us=$(echo "$c0 $c1 $n $hz" | awk '{printf "%.2f", ($2-$1)/$4*1e6/$3}')
   echo "$(basename $bin) $mode $w rate=$rt cpu_us_per_job=$us $(pdelta "$s0" "$s1") load=$(cut -d' ' -f1 /proc/loadavg)"
   kill $pid; wait $pid 2>/dev/null; rm -rf $d $d.log $d.mp
  done
 done
done
