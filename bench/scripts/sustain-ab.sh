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
. "$(dirname "$0")/node-lib.sh"
for r in $(seq $reps); do
 for bin in "$@"; do
   start_node "$bin" $mode || continue
   n=${N:-2000000}
   s0=$(pebble $p); c0=$(cpu $pid)
   rt=$($QB -size 100 -addr 127.0.0.1:$p -mode add -n $n -conns 8 -pipeline 64 | sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p')
   c1=$(cpu $pid); s1=$(pebble $p)
   us=$(echo "$c0 $c1 $n $hz" | awk '{printf "%.2f", ($2-$1)/$4*1e6/$3}')
   echo "$(basename $bin) $mode sustain rate=$rt cpu_us_per_job=$us $(pdelta "$s0" "$s1") load=$(cut -d' ' -f1 /proc/loadavg)"
   stop_node
 done
done
