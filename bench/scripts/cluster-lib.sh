# Sourced by the cluster benchmark scripts (cluster-ab, cluster-rss, federation-ab, federation-vs-disque,
# cross-latency): the three steps every one of them takes to stand up 3 local nodes, and the up/down pair
# two of them share.

# free_base [OFFSET...]: a port b such that b, b+1, b+2 are free on 127.0.0.1, and so are the same three
# at each OFFSET above b (10000: the default bus ports; 100: the scripts' metrics ports).
free_base() {
  python3 - "$@" <<'PY'
import socket, random, sys
offsets = [0] + [int(o) for o in sys.argv[1:]]
while True:
    p = random.randint(21000, 29000)
    try:
        for o in offsets:
            for i in range(3):
                s = socket.socket(); s.bind(("127.0.0.1", p + o + i)); s.close()
        print(p); break
    except OSError:
        pass
PY
}

# wait_loaded PORT...: until each node's INFO says loading:0 (10 s at most each).
wait_loaded() {
  local p k
  for p in "$@"; do
    for k in $(seq 200); do redis-cli -p $p info persistence 2>/dev/null | grep -q '^loading:0' && break; sleep 0.05; done
  done
}

# meet3 P0 P1 P2: MEET the three nodes in a chain and wait (30 s at most) until each sees the other two
# reachable; fails (status 1) if they do not.
meet3() {
  local p k n
  redis-cli -p $1 cluster meet 127.0.0.1 $2 >/dev/null
  redis-cli -p $2 cluster meet 127.0.0.1 $3 >/dev/null
  for k in $(seq 300); do
    n=0; for p in "$@"; do redis-cli -p $p cluster info 2>/dev/null | grep -q 'cluster_reachable_nodes:2' && n=$((n+1)); done
    [ $n = 3 ] && return 0; sleep 0.1
  done
  return 1
}

# up BIN / down: for a script that sets work, mode (memory, everysec or always) and pids: three nodes of
# BIN on fresh directories under $work/data (ports in P), met and loaded; down kills them and removes the data.
up() {
  local bin=$1; pids=(); b=$(free_base 10000); P=($b $((b+1)) $((b+2)))
  for i in 0 1 2; do
    d="$work/data/n$i"; mkdir -p "$d"
    case $mode in
      memory) "$bin" --port ${P[$i]} --dir "$d" --bind 127.0.0.1 --appendonly no >"$d.log" 2>&1 & ;;
      *) "$bin" --port ${P[$i]} --dir "$d" --bind 127.0.0.1 --appendonly yes --appendfsync $mode >"$d.log" 2>&1 & ;;
    esac
    pids+=($!)
  done
  wait_loaded "${P[@]}"
  meet3 "${P[@]}" && return 0
  echo "cluster did not form"; return 1
}
down() { for p in "${pids[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; pids=(); rm -rf "$work/data"; }
