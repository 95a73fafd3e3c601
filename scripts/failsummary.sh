#!/usr/bin/env bash
# failsummary.sh LOG: after a failed `make test`, print each failed test with the first lines its
# test files wrote (t.Log/t.Error lines, not the daemons' logs they forward), short, so that the
# end of the output (all a CI page may show) says what failed and why. All of it is in LOG.
set -euo pipefail
log=$1
echo "failed tests (the first lines from their test files; all of it in $log):"
awk '
function trim(s) { sub(/^[ \t]+/, "", s); return s }
/^[ \t]*--- FAIL: / { name = $3; left = 3; print name; next }
/^[ \t]*--- (PASS|SKIP): / || /^(ok|FAIL|PASS)[ \t]/ { left = 0; next }
left > 0 && /^[ \t]+[A-Za-z0-9_]+_test\.go:[0-9]+: / && !/level=|"ok":true|e2e scheduler: waited/ {
	print "  " substr(trim($0), 1, 160); left--
}
' "$log" | head -n 24
grep -E '^(FAIL[ \t]|panic: )' "$log" | head -n 6 || true
