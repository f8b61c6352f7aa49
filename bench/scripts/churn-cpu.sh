#!/usr/bin/env bash
# churn-cpu.sh LABEL SERVER: the churn beside a backlog (as in bench/README.md)
# and the server's CPU seconds (utime + stime from /proc) until the bench kills
# it. Prints: LABEL (N jobs/s) cpu=SECONDS. Run from the repository root after
# `make build`; alternate builds.
set -uo pipefail
label=$1 server=$2 out=$(mktemp)
bin/diskque-bench --churn --server "$server" --count 600000 --backlog 100000 \
  --server-args "--gc-interval 1" >"$out" 2>&1 &
bench=$!
pid=""
until [ -n "$pid" ]; do pid=$(pgrep -n -f "^$server " || true); sleep 0.05; done
ticks=0
while stat=$(cat /proc/$pid/stat 2>/dev/null); do
  f=(${stat##*) })   # fields after the command name: utime and stime are 12 and 13
  ticks=$(( ${f[11]} + ${f[12]} ))
  sleep 0.05
done
wait $bench
echo "$label $(grep -o '([0-9]* jobs/s)' "$out" | head -1) cpu=$(echo "scale=2; $ticks/$(getconf CLK_TCK)" | bc)"
rm -f "$out"
