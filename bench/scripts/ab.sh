#!/usr/bin/env bash
# ab.sh LABEL SERVER MODE: one side-by-side sample of a diskque-server build.
# A fresh server on a temporary directory (appendfsync MODE, port 7801), then
#   diskque-bench --workload produce --count 300000 --clients 50 --pipeline 16
#   diskque-bench --workload consume --prefill 0 --count 300000 --clients 50 --pipeline 16
# and one line: LABEL MODE produce16=OPS/S consume16=OPS/S. Alternate builds
# (ab.sh old A everysec; ab.sh new B everysec; ...) and quote both columns.
# Run from the repository root after `make build` (it uses bin/diskque-bench).
set -euo pipefail
label=$1 server=$2 mode=$3 port=7801
dir=$(mktemp -d)
"$server" --dir "$dir" --port $port --appendfsync "$mode" >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
until redis-cli -p $port PING >/dev/null 2>&1; do sleep 0.05; done
ops() { bin/diskque-bench --addr 127.0.0.1:$port "$@" 2>/dev/null | tail -1 | awk -F'|' '{print $10}'; }
p=$(ops --workload produce --count 300000 --clients 50 --pipeline 16)
c=$(ops --workload consume --prefill 0 --count 300000 --clients 50 --pipeline 16)
echo "$label $mode produce16=$p consume16=$c"
