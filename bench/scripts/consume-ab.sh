#!/bin/bash
# consume-ab.sh REPS MODE BIN...: alternating runs of vs-disque.sh's consume and mixed workloads (the same
# qbench load) against each diskque-server build, fresh each run; prints jobs/s and the server's CPU-µs per job
# (user+system from /proc, over the consume phase only for consume). MODE: memory, everysec or always.
# WL="consume mixed" picks workloads, N the consume backlog (200000), QB the qbench binary
# (build it: cd ../shared/peers/qbench && go build -o /tmp/qbench .), EXTRA more server flags.
# Each line also has what Pebble flushed, compacted (written) and read for compactions over the measured phase,
# in MB, and its compactions (INFO storage's index_* lines; "-" for a build without them), and the L0 files at the end.
# PROF=DIR saves a CPU profile of each consume phase (SECS seconds, default 4, from its start) in DIR as
# BUILD-MODE-RUN.prof (the server gets --metrics-addr and --pprof).
set -u
reps=$1 mode=$2; shift 2
QB=${QB:-/tmp/qbench}
body=$(head -c 100 /dev/zero | tr '\0' x)
hz=$(getconf CLK_TCK)
. "$(dirname "$0")/node-lib.sh"
rate() { sed -n 's/.*rate=\([0-9]*\) jobs.*/\1/p'; }
for r in $(seq $reps); do
 for bin in "$@"; do
  for w in ${WL:-consume mixed}; do
   prof=(); [ -n "${PROF:-}" ] && prof=(--metrics-addr 127.0.0.1:PORT1 --pprof yes)
   start_node "$bin" $mode ${EXTRA:-} "${prof[@]}" || continue
   if [ $w = consume ]; then
     $QB -size 100 -addr 127.0.0.1:$p -mode add -n ${N:-200000} -conns 4 -pipeline 64 >/dev/null
     s0=$(pebble $p); c0=$(cpu $pid); t0=$(date +%s.%N)
     cp=
     if [ -n "${PROF:-}" ]; then
       mkdir -p "$PROF"
       curl -s -o "$PROF/$(basename $bin)-$mode-$r.prof" "http://127.0.0.1:$((p+1))/debug/pprof/profile?seconds=${SECS:-4}" &
       cp=$!
     fi
     rt=$($QB -size 100 -addr 127.0.0.1:$p -mode getack -count 100 -conns 4 | rate)
     c1=$(cpu $pid); s1=$(pebble $p); n=${N:-200000}
     [ -n "$cp" ] && wait $cp
   else
     s0=$(pebble $p); c0=$(cpu $pid)
     $QB -size 100 -addr 127.0.0.1:$p -mode add -n 400000 -conns 8 -pipeline 16 > $d.mp &
     pp=$!
     rt=$($QB -size 100 -addr 127.0.0.1:$p -mode getack -count 100 -conns 4 -timeout 2000 -n 400000 | rate)
     wait $pp; c1=$(cpu $pid); s1=$(pebble $p); n=400000
   fi
   us=$(echo "$c0 $c1 $n $hz" | awk '{printf "%.2f", ($2-$1)/$4*1e6/$3}')
   echo "$(basename $bin) $mode $w rate=$rt cpu_us_per_job=$us $(pdelta "$s0" "$s1") load=$(cut -d' ' -f1 /proc/loadavg)"
   stop_node; rm -f $d.mp
  done
 done
done
