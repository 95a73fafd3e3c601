#!/usr/bin/env bash
# make fuzz: run every Go fuzz target of the module (each func FuzzXxx in a _test.go file), one
# after another, for FUZZTIME each (default 10m: the whole run takes targets × FUZZTIME), then
# print a table of target, time, execs and result. FUZZ=regexp runs only the matching targets;
# FUZZPARALLEL sets the fuzzing workers (default: go's, GOMAXPROCS); FUZZMINIMIZETIME bounds
# the minimizing of each input that found new coverage (default 10s; go's is 60s, which a target
# of slow inputs, FuzzRestore, FuzzCheckPolicy, spent most of a minute on without an exec counted). A failing input is written
# by go test under the package's testdata/fuzz/FuzzXxx/: commit it with the fix, and it runs in
# `make test` from then on. The seed corpora run in `make test` as ordinary tests.
set -uo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10m}
FUZZ=${FUZZ:-.}
par=(-fuzzminimizetime "${FUZZMINIMIZETIME:-10s}")
[ -n "${FUZZPARALLEL:-}" ] && par+=(-parallel "$FUZZPARALLEL")
mapfile -t targets < <(git ls-files '*_test.go' | xargs grep -H -o '^func Fuzz[A-Za-z0-9_]*' | sed 's/:func /:/' | sort)
log=$(mktemp -d "${TMPDIR:-/tmp}/kloud-fuzz.XXXXXX")
trap 'rm -rf "$log"' EXIT
results=()
failed=0
for t in "${targets[@]}"; do
	file=${t%%:*} name=${t##*:}
	pkg=./$(dirname "$file")
	[[ "$pkg:$name" =~ $FUZZ ]] || continue
	echo "== $pkg $name for $FUZZTIME"
	start=$(date +%s)
	go test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" "${par[@]}" 2>&1 | tee "$log/out"
	rc=${PIPESTATUS[0]}
	secs=$(($(date +%s) - start))
	execs=$(grep -o 'execs: [0-9]*' "$log/out" | tail -1 | cut -d' ' -f2)
	res=ok
	if [ "$rc" != 0 ]; then res=FAIL; failed=1; fi
	results+=("$(printf '%-28s %-22s %6ss %12s  %s' "$pkg" "$name" "$secs" "${execs:-0}" "$res")")
done
echo
printf '%-28s %-22s %7s %12s  %s\n' package target time execs result
printf '%s\n' "${results[@]}"
exit $failed
