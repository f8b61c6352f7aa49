#!/bin/bash
# sustain-ab.sh REPS MODE BIN...: alternating runs of vs-disque.sh's sustain load (qbench -mode add, N jobs,
# default 2,000,000, 8 conns, pipeline 64, 100-byte bodies) against each diskque-server build, fresh server and
# data directory each run; prints jobs/s, the server's CPU-µs per ADDJOB (user+system from /proc over the load)
# and what Pebble flushed, compacted (written) and read for compactions over it (INFO storage), with L0's
# files at the end. MODE: memory, everysec or always; QB the qbench binary.
set -u
reps=$1 mode=$2; shift 2
QB=${QB:-/tmp/qbench}
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
pebble() { redis-cli -p $1 info storage 2>/dev/null | tr -d '\r' | awk -F: '
  $1=="index_flushed_bytes"{f=$2} $1=="index_compacted_bytes"{c=$2} $1=="index_compaction_read_bytes"{r=$2}
  $1=="index_compactions"{n=$2} $1=="index_l0_files"{l=$2}
  END{if(f=="")print "- - - - -"; else printf "flushed_mb=%.1f compacted_mb=%.1f compact_read_mb=%.1f compactions=%d l0=%d\n", f/1e6, c/1e6, r/1e6, n, l}'; }
for r in $(seq $reps); do
 for bin in "$@"; do
   p=$(port); d=$(mktemp -d)
   if [ "$mode" = memory ]; then "$bin" --port $p --dir $d --appendonly no >$d.log 2>&1 &
   else "$bin" --port $p --dir $d --appendonly yes --appendfsync $mode >$d.log 2>&1 & fi
   pid=$!
   for i in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q "^loading:0" && break; sleep 0.05; done
   n=${N:-2000000}
   c0=$(cpu $pid)
   rt=$($QB -size 100 -addr 127.0.0.1:$p -mode add -n $n -conns 8 -pipeline 64 | sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p')
   c1=$(cpu $pid)
   us=$(echo "$c0 $c1 $n $hz" | awk '{printf "%.2f", ($2-$1)/$4*1e6/$3}')
   echo "$(basename $bin) $mode sustain rate=$rt cpu_us_per_job=$us $(pebble $p) load=$(cut -d' ' -f1 /proc/loadavg)"
   kill $pid; wait $pid 2>/dev/null; rm -rf $d $d.log
 done
done
