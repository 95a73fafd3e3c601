#!/usr/bin/env bash
# machine.sh — throughput of a stack's bucket from inside a machine vs the same S3 server reached
# from the host, in one run: PUT and GET of a SIZE MiB object (default 256) with curl's SigV4
# (UNSIGNED-PAYLOAD, so neither side hashes the body), 3 rounds each, median, and the ratio
# machine/host. The machine's run uses its owner's login shell (the keys klient wrote, as a user
# has them); the host's uses `kloud bucket credentials`.
#
# Needs a running kloud (make run) and a built stack whose template claims a bucket, e.g. the
# demo's (bucket "shared"), the CLI's key being the stack owner's:
#   bench/buckets/machine.sh STACK [MACHINE=dev.0] [LABEL=shared] [SIZE_MIB=256]
set -euo pipefail
cd "$(dirname "$0")/../.."
stack=${1:?usage: $0 STACK [MACHINE] [LABEL] [SIZE_MIB]} machine=${2:-dev.0} label=${3:-shared} mib=${4:-256}
kloud=${KLOUD_BIN:-bin/kloud}
L=${label^^}
L=${L//-/_}

# One round of PUT then GET; prints "put MB/s get MB/s" (curl's averages, bytes/s → MB/s).
round='f=/tmp/bench-obj; [ -s $f ] || head -c $((MIB*1048576)) /dev/urandom > $f;
u="$KLOUD_BUCKET_L_ENDPOINT/$KLOUD_BUCKET_L_NAME/bench-obj-$RANDOM";
a="--aws-sigv4 aws:amz:$KLOUD_BUCKET_L_REGION:s3 -u $KLOUD_BUCKET_L_ACCESS_KEY_ID:$KLOUD_BUCKET_L_SECRET_ACCESS_KEY";
p=$(curl -sS --fail $a -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -T $f -o /dev/null -w "%{speed_upload}" "$u");
g=$(curl -sS --fail $a -o /dev/null -w "%{speed_download}" "$u");
curl -sS --fail $a -X DELETE -o /dev/null "$u";
echo "BENCH $p $g"'
round=${round//_L_/_${L}_}
round=${round//MIB/$mib}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mbs() { awk '{printf "%.0f", $1/1e6}'; }

declare -a hp hg mp mg
# The host: the owner's key from kloud, exported under the same names the machine's files use.
eval "$("$kloud" bucket credentials "$stack" "$label" | sed -e "s/^export KLOUD_BUCKET=/export KLOUD_BUCKET_${L}_NAME=/" \
	-e "s/^export AWS_ENDPOINT_URL=/export KLOUD_BUCKET_${L}_ENDPOINT=/" -e "s/^export AWS_REGION=/export KLOUD_BUCKET_${L}_REGION=/" \
	-e "s/^export AWS_ACCESS_KEY_ID=/export KLOUD_BUCKET_${L}_ACCESS_KEY_ID=/" -e "s/^export AWS_SECRET_ACCESS_KEY=/export KLOUD_BUCKET_${L}_SECRET_ACCESS_KEY=/")"
tmp=$(mktemp -d "${KLOUD_CACHE:-/var/cache/kloud}/.bench-buckets.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3; do
	read -r p g < <(cd "$tmp" && TMPDIR=$tmp bash -c "${round//\/tmp\//$tmp/}" | sed -n 's/^BENCH //p')
	hp+=("$p") hg+=("$g")
	out=$(echo "$round; rm -f /tmp/bench-obj-keep; exit" | "$kloud" ssh "$machine" 2>&1 | tr -d '\r')
	read -r p g < <(echo "$out" | sed -n 's/.*BENCH \([0-9][0-9.]*\) \([0-9][0-9.]*\).*/\1 \2/p' | tail -1) # after the prompt's escapes
	[[ -n "${p:-}" ]] || { echo "machine round failed:" >&2; echo "$out" >&2; exit 1; }
	mp+=("$p") mg+=("$g")
done
echo 'rm -f /tmp/bench-obj; exit' | "$kloud" ssh "$machine" >/dev/null 2>&1 || true
H_P=$(printf '%s\n' "${hp[@]}" | median | mbs) H_G=$(printf '%s\n' "${hg[@]}" | median | mbs)
M_P=$(printf '%s\n' "${mp[@]}" | median | mbs) M_G=$(printf '%s\n' "${mg[@]}" | median | mbs)
echo "| ${mib} MiB, median of 3 (MB/s) | PUT | GET |"
echo "|---|---:|---:|"
echo "| from the host | $H_P | $H_G |"
echo "| from machine $machine | $M_P | $M_G |"
awk -v a="$M_P" -v b="$H_P" -v c="$M_G" -v d="$H_G" 'BEGIN {printf "| ratio machine/host | %.2f | %.2f |\n", a/b, c/d}'
