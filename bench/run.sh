#!/usr/bin/env bash
# bench/run.sh — every benchmark, each against its baseline in the same run, ratios printed.
# `make bench` runs it after setup and build (the env of $KLOUD_CACHE/env is loaded).
# Run one with: bench/run.sh p1|p2|p2replicas|tfapply|localboot|webterm|storegrowth|plugin|snapshot|ports|ssh|buckets
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
run() {
	echo
	echo "=== $1"
	shift
	# A benchmark exits 1 when it misses its target: say so, go on with the others.
	"$@" || { rc=$?; echo "=== exit $rc (1: a target missed; 2: an error)"; status=1; }
}
want=${1:-all}
has() { [ "$want" = all ] || [ "$want" = "$1" ]; }
has p1 && run "P1: kite call round trip vs raw WebSocket echo" go run ./bench/cmd/p1
has p2 && run "P2: kontrol with 10,000 kites (kloud serve process) vs raw WebSocket connects" go run ./bench/cmd/p2
has p2replicas && run "P2 across 3 kloud replicas on one store server, then a SIGKILL (failover) vs raw WebSocket connects" go run ./bench/cmd/p2 -replicas 3
has tfapply && run "Terraformer apply overhead vs terraform apply" go run ./bench/tfapply -n 20
has storegrowth && run "Store growth: job update, machine transition, stack.apply's store share with 100/1,000/10,000 finished jobs" go run ./bench/storegrowth
has plugin && run "Provider plugins: the example provider in-process vs as a plugin (machine.info, stack.apply, restart after a crash)" go run ./bench/plugin
has snapshot && run "Local machine snapshots: snapshot and restore of 1 GiB vs tar" go run ./bench/snapshot -size 1024 -rounds 3
if has localboot && [ -d bench/localboot ]; then
	run "Local machines: boot to agent, stack.apply vs raw terraform apply + agents" go run ./bench/localboot
fi
has buckets && run "Buckets: provisioner latency; PUT/GET of 64 MiB through weed's S3 vs plain HTTP to a file" go run ./bench/buckets
has ports && run "Port forwarding through kloud vs a direct TCP connection (throughput, echo latency)" go run ./bench/ports
has ssh && run "scp through kloud (kloud config-ssh) vs scp to the same SSH server on the machine's bridge address" go run ./bench/ssh
if has webterm && [ -d bench/webterm ]; then
	run "Web terminal vs gotty" bench/webterm/run.sh
fi
exit $status
