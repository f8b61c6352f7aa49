# node-lib.sh: sourced by the single-node A/B scripts (consume-ab.sh, sustain-ab.sh): the steps each takes to
# start one fresh diskque node and read its CPU and Pebble figures.
# free_port: a port p such that p, p+1 (a metrics port) and p+10000 (the default bus port) are free on 127.0.0.1.
free_port() { python3 -c '
import socket,random
while True:
    p=random.randint(21000,29000)
    try:
        for q in (p,p+1,p+10000):
            s=socket.socket(); s.bind(("127.0.0.1",q)); s.close()
        print(p); break
    except OSError: pass'; }
# start_node BIN MODE [FLAGS...]: a fresh server of BIN (appendfsync MODE, or the AOF off for memory) on a free
# port, in a new temporary directory; sets p, d (the directory; its log is $d.log) and pid, and returns once
# the server is loaded. PORT1 in a flag stands for p+1 (e.g. --metrics-addr 127.0.0.1:PORT1).
start_node() {
  local bin=$1 mode=$2 a; shift 2
  p=$(free_port); d=$(mktemp -d)
  local flags=()
  for a in "$@"; do flags+=("${a//PORT1/$((p+1))}"); done
  if [ "$mode" = memory ]; then "$bin" --port $p --dir $d --appendonly no "${flags[@]}" >$d.log 2>&1 &
  else "$bin" --port $p --dir $d --appendonly yes --appendfsync $mode "${flags[@]}" >$d.log 2>&1 & fi
  pid=$!
  for i in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q "^loading:0" && return 0; sleep 0.05; done
  echo "start failed: $bin $mode" >&2; return 1
}
# stop_node: stops the server start_node started and removes its directory.
stop_node() { kill $pid; wait $pid 2>/dev/null; rm -rf $d $d.log; }
# cpu PID: the process's user+system CPU in clock ticks (getconf CLK_TCK a second).
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
# pebble PORT: INFO storage's Pebble figures: flushed, compacted (written) and compaction-read bytes,
# compactions, L0 files ("- - - - -" for a build without them).
pebble() { redis-cli -p $1 info storage 2>/dev/null | tr -d '\r' | awk -F: '
  $1=="index_flushed_bytes"{f=$2} $1=="index_compacted_bytes"{c=$2} $1=="index_compaction_read_bytes"{r=$2}
  $1=="index_compactions"{n=$2} $1=="index_l0_files"{l=$2}
  END{if(f=="")print "- - - - -"; else print f, c, r, n, l}'; }
# pdelta BEFORE AFTER: what Pebble did between two `pebble` readings, in MB, and L0's files at the end.
pdelta() { echo "$1 $2" | awk '$1=="-"||$6=="-"{print "flushed_mb=- compacted_mb=- compact_read_mb=- compactions=- l0=-"; exit}
  {printf "flushed_mb=%.1f compacted_mb=%.1f compact_read_mb=%.1f compactions=%d l0=%d\n", ($6-$1)/1e6, ($7-$2)/1e6, ($8-$3)/1e6, $9-$4, $10}'; }
