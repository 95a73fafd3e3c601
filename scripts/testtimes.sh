#!/usr/bin/env bash
# Where the suite's time goes: reads `go test -json` output (files, or standard input) and prints
# each package's wall time with the sum of its top-level tests' times (a sum far above the wall
# time means its tests run in parallel), then the N slowest top-level tests (default 25).
#
#   go test -race -json ./... >run.json; scripts/testtimes.sh run.json
#   scripts/testtimes.sh -n 50 run.json
#   scripts/testtimes.sh -p ./kloud run.json    # only the tests of one package
set -euo pipefail

usage() {
	echo "usage: $0 [-n N] [-p PACKAGE] [FILE...]  (go test -json output; standard input without FILE)" >&2
	exit 2
}
n=25
pkg=""
while getopts "n:p:h" o; do
	case $o in
	n) [[ $OPTARG =~ ^[0-9]+$ ]] || usage; n=$OPTARG ;;
	p) pkg=${OPTARG#./} ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
command -v jq >/dev/null || { echo "$0: needs jq (scripts/setup.sh installs it)" >&2; exit 1; }
for f in "$@"; do [ -r "$f" ] || { echo "$0: cannot read $f" >&2; exit 1; }; done

# Only the lines that are JSON objects with a final Action: go test mixes build errors in. A
# top-level test takes the longest time of itself and its subtests (a test whose subtests run in
# parallel ends, as go test reports it, before them, after 0 s).
events=$(cat "$@" | jq -c -R --arg pkg "$pkg" '
	fromjson? | select(type == "object" and (.Action == "pass" or .Action == "fail" or .Action == "skip"))
	| .Package |= sub("^github.com/kloud-dev/kloud/?"; "") | .Package |= (if . == "" then "." else . end)
	| select($pkg == "" or .Package == $pkg)' | jq -c -s '
	(map(select(.Test != null)) | group_by([.Package, (.Test | split("/")[0])])
		| map({key: (.[0].Package + " " + (.[0].Test | split("/")[0])), value: (map(.Elapsed // 0) | max)}) | from_entries) as $longest
	| .[] | if .Test != null and (.Test | contains("/") | not) then .Elapsed = $longest[.Package + " " + .Test] else . end')
if [ -z "$events" ]; then
	echo "$0: no test results in the input (was it go test -json?)" >&2
	exit 1
fi

echo "== packages by wall time (s): wall, sum of top-level tests, tests, result"
jq -r -s '
	(map(select(.Test != null and (.Test | contains("/") | not))) | group_by(.Package)
		| map({key: .[0].Package, value: {sum: (map(.Elapsed // 0) | add), n: length}}) | from_entries) as $t
	| map(select(.Test == null and .Action != "skip")) | sort_by(-(.Elapsed // 0))[]
	| [(.Elapsed // 0 | tostring), (($t[.Package].sum // 0) * 10 | round / 10 | tostring),
	   ($t[.Package].n // 0 | tostring), .Action, .Package] | @tsv' <<<"$events" |
	awk -F'\t' '{printf "%8.1f %8.1f %5d  %-4s %s\n", $1, $2, $3, $4, $5; w += $1} END {printf "%8.1f total package time\n", w}'

echo "== $n slowest top-level tests (s)"
jq -r -s --argjson n "$n" '
	map(select(.Test != null and (.Test | contains("/") | not))) | sort_by(-(.Elapsed // 0)) | .[:$n][]
	| [(.Elapsed // 0 | tostring), .Action, .Package, .Test] | @tsv' <<<"$events" |
	awk -F'\t' '{printf "%8.1f %-4s %s %s\n", $1, $2, $3, $4}'
