#!/usr/bin/env bash
# Runs Disque 1.0's own cluster test suite, unchanged, against diskque-server
# used as a drop-in for disque-server (CLUSTER.md "How it is checked").
#
#   testdata/disque-suite/run.sh SUITE_DIR [BIN] [UNIT_GLOB]
#
# SUITE_DIR holds the suite as in Disque's repository: tests/instances.tcl,
# tests/support/*.tcl and tests/cluster/{run.tcl,cluster.tcl,tests/...}
# (README "Developing" says where to get it). BIN defaults to
# bin/diskque-server. UNIT_GLOB (default: every unit) is matched by the suite's
# --single option against the units' paths, e.g. '05-*' or '0[0-4]-*'.
#
# The suite runs from a copy of SUITE_DIR in a new temporary directory, with
# BIN copied to src/disque-server there (the suite starts its 7 instances as
# ../../../src/disque-server from tests/cluster/tmp). The suite exits 0 even
# when tests fail (it prints the failure and jumps to the next unit), so
# success here is read from its output: every selected unit started, no
# "(Jumping to next unit after error)", no aborted run, and its final
# "Cleaning up". Exit status: 0 all passed, 1 a failure (the working directory,
# with each instance's log.txt and data, is kept and named), 2 bad usage.
# The output is also written to suite.log in the working directory; TERM=dumb
# turns off the suite's colours so that it can be read back.
set -uo pipefail

usage() { echo "usage: $0 SUITE_DIR [BIN] [UNIT_GLOB]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 3 ] || usage
here="$(cd "$(dirname "$0")" && pwd)"
suite="$1"
bin="${2:-bin/diskque-server}"
glob="${3:-}"

[ -f "$suite/tests/cluster/run.tcl" ] && [ -f "$suite/tests/instances.tcl" ] || {
	echo "$suite does not hold Disque's suite (no tests/cluster/run.tcl or tests/instances.tcl)" >&2
	exit 2
}
[ -x "$bin" ] || { echo "$bin: not an executable (build it: make build)" >&2; exit 2; }
command -v tclsh >/dev/null || { echo "tclsh is not installed" >&2; exit 2; }

units=()
for f in "$suite"/tests/cluster/tests/*.tcl; do
	u="$(basename "$f")"
	# The suite matches *GLOB* against ../tests/UNIT; a unit matches here the same way.
	if [ -z "$glob" ] || [[ "../tests/$u" == *$glob* ]]; then units+=("$u"); fi
done
[ ${#units[@]} -gt 0 ] || { echo "no unit of $suite matches '$glob'" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/disque-suite.XXXXXX")"
cp -a "$suite/." "$work/"
mkdir -p "$work/src" "$work/tests/cluster/tmp"
cp "$bin" "$work/src/disque-server"
cp "$here/keep-dirs.tcl" "$work/keep-dirs.tcl"

echo "disque-suite: $(date -u +%FT%TZ) units: ${units[*]}"
echo "disque-suite: binary $bin ($(sha256sum "$bin" | cut -c1-12)), working directory $work"
args=()
[ -n "$glob" ] && args=(--single "$glob")
start=$(date +%s)
(cd "$work" && TERM=dumb tclsh keep-dirs.tcl "${args[@]}") 2>&1 | tee "$work/suite.log"
rc=${PIPESTATUS[0]}
elapsed=$(( $(date +%s) - start ))

log="$work/suite.log"
failed=$(grep -c '(Jumping to next unit after error)' "$log")
started=$(grep -c '^Testing unit: ' "$log")
fail=0
[ "$rc" -eq 0 ] || { echo "disque-suite: tclsh exited $rc (the suite aborted)"; fail=1; }
[ "$failed" -eq 0 ] || { echo "disque-suite: $failed unit(s) had a failing test:"; grep -B1 '(Jumping to next unit after error)' "$log" | grep -v '^--$' | grep -v 'Jumping'; fail=1; }
[ "$started" -eq ${#units[@]} ] || { echo "disque-suite: $started of ${#units[@]} units started"; fail=1; }
grep -q '^Cleaning up' "$log" || { echo "disque-suite: the suite did not reach its cleanup"; fail=1; }
# Per unit: ok, FAIL (a test of it failed), ABORTED (the suite stopped in it:
# an error that was not an assertion, such as an error reply nothing caught)
# or "not run" (a selected unit after an abort).
awk -v rc="$rc" -v want="${units[*]}" '
	/^Testing unit: /{u=$3; order[++n]=u}
	/\(Jumping to next unit after error\)/{bad[u]="FAIL"}
	END{if (rc != 0 && n > 0) bad[order[n]]="ABORTED"
		m=split(want, w, " ")
		for (i=1;i<=m;i++) { s="not run"; for (j=1;j<=n;j++) if (order[j]==w[i]) s=(w[i] in bad ? bad[w[i]] : "ok")
			printf "disque-suite: %-28s %s\n", w[i], s }}' "$log"
if [ "$fail" -ne 0 ]; then
	echo "disque-suite: FAILED after ${elapsed}s; logs kept in $work (suite.log, tests/cluster/tmp/disque_N/log.txt)"
	exit 1
fi
rm -rf "$work"
echo "disque-suite: PASSED (${#units[@]} units, ${elapsed}s)"
