#!/bin/bash
# idle-rss.sh RUNS DIR...: alternating runs, per build directory DIR (holding diskque-server; the load is
# $BENCH, default DIR/diskque-bench of the first): a fresh server (appendfsync everysec) per run, 1M produce
# ADDJOBs at 50 clients pipeline 16, then the VmRSS right after the fill (rss0, what --workload restart reads
# at its SIGKILL) and 3 s later (rss3, the backlog held idle), in MB, and the server CPU-s of the fill.
runs=$1; shift; BENCH=${BENCH:-$1/diskque-bench}
port=27800
for r in $(seq 1 $runs); do for bin in "$@"; do
  d=$(mktemp -d /tmp/memrss.XXXX); port=$((port+1))
  $bin/diskque-server --port $port --dir $d --appendonly yes --appendfsync everysec --cluster-bus-port 0 >$d.log 2>&1 & pid=$!
  for i in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
  c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  $BENCH --addr 127.0.0.1:$port --workload produce --count 1000000 --clients 50 --pipeline 16 >/dev/null 2>&1
  r0=$(awk '/VmRSS/{print $2}' /proc/$pid/status); c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  sleep 3; r3=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
  echo "$(basename $bin) run=$r rss0_mb=$(echo "scale=1;$r0/1000"|bc) rss3_mb=$(echo "scale=1;$r3/1000"|bc) fill_cpu_s=$(echo "scale=2;($c1-$c0)/100"|bc) load=$(cut -d' ' -f1 /proc/loadavg)"
  kill -9 $pid; wait $pid 2>/dev/null; rm -rf $d $d.log
done; done
