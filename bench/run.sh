#!/usr/bin/env bash
# bench/run.sh — every benchmark, each against its baseline in the same run, ratios printed.
# `make bench` runs it after setup and build (the env of $KLOUD_CACHE/env is loaded).
# Run one with: bench/run.sh p1|p2|p2replicas|tfapply|localboot|webterm|storegrowth|plugin|snapshot|ports|ssh|buckets
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
# Each benchmark's output is kept in $last (one file per benchmark); the next run prints the lines
# whose figures changed beside the earlier ones (old | new), so a run shows what moved.
last="${KLOUD_CACHE:-/var/cache/kloud}/bench-last"
mkdir -p "$last"
run() {
	local key=$1 out
	shift
	echo
	echo "=== $1"
	shift
	out=$(mktemp "$last/$key.XXXXXX")
	# A benchmark exits 1 when it misses its target: say so, go on with the others.
	"$@" 2>&1 | tee "$out" || { rc=${PIPESTATUS[0]}; echo "=== exit $rc (1: a target missed; 2: an error)"; status=1; }
	if [ -s "$last/$key.txt" ]; then
		echo "=== $key beside its last run of $(date -r "$last/$key.txt" '+%F %R') (old | new, the lines that changed):"
		diff --side-by-side --suppress-common-lines --width 200 "$last/$key.txt" "$out" || true
	else
		echo "=== $key: no earlier run in $last to compare with (bench/RESULTS.md has the recorded figures)"
	fi
	mv "$out" "$last/$key.txt"
}
want=${1:-all}
has() { [ "$want" = all ] || [ "$want" = "$1" ]; }
has p1 && run p1 "P1: kite call round trip vs raw WebSocket echo" go run ./bench/cmd/p1
has p2 && run p2 "P2: kontrol with 10,000 kites (kloud serve process) vs raw WebSocket connects" go run ./bench/cmd/p2
has p2replicas && run p2replicas "P2 across 3 kloud replicas on one store server, then a SIGKILL (failover) vs raw WebSocket connects" go run ./bench/cmd/p2 -replicas 3
has tfapply && run tfapply "Terraformer apply overhead vs terraform apply" go run ./bench/tfapply -n 20
has storegrowth && run storegrowth "Store growth: job update, machine transition, stack.apply's store share with 100/1,000/10,000 finished jobs" go run ./bench/storegrowth
has plugin && run plugin "Provider plugins: the example provider in-process vs as a plugin (machine.info, stack.apply, restart after a crash)" go run ./bench/plugin
has snapshot && run snapshot "Local machine snapshots: snapshot and restore of 1 GiB vs tar" go run ./bench/snapshot -size 1024 -rounds 3
if has localboot && [ -d bench/localboot ]; then
	run localboot "Local machines: boot to agent, stack.apply vs raw terraform apply + agents; prebuilt stacks: claim vs build to a terminal" go run ./bench/localboot -pool
fi
has buckets && run buckets "Buckets: provisioner latency; PUT/GET of 64 MiB through weed's S3 vs plain HTTP to a file" go run ./bench/buckets
has ports && run ports "Port forwarding through kloud vs a direct TCP connection (throughput, echo latency)" go run ./bench/ports
has ssh && run ssh "scp through kloud (kloud config-ssh) vs scp to the same SSH server on the machine's bridge address" go run ./bench/ssh
if has webterm && [ -d bench/webterm ]; then
	run webterm "Web terminal vs gotty" bench/webterm/run.sh
fi
exit $status
