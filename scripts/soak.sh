#!/usr/bin/env bash
# Soak test: two processes on loopback doing verified RDMA WRITE/READ/FETCH_ADD
# operations through uroce's fault layer for DURATION seconds (default 1800),
# sampling each process's resident memory and open file descriptors every
# 30 s. Fails if the client reports an error or if memory or descriptors
# grow after the first minute (more than 10 % / any descriptor).
# Usage: scripts/soak.sh [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-1800}
cargo build -q --release -p uroce --bin uroce-rc-peer
P=target/release/uroce-rc-peer
F="loss=0.005,dup=0.005,reorder=0.01,corrupt=0.001,delay_us=300"
port=$((20000 + RANDOM % 10000))
log=$(mktemp -d)
UROCE_ADDR=127.0.0.201 UROCE_FAULTS="$F,seed=1" $P --server $port >"$log/server" 2>&1 &
srv=$!
sleep 0.5
# Far more operations than fit in the duration; stopped at the deadline.
UROCE_ADDR=127.0.0.202 UROCE_FAULTS="$F,seed=2" UROCE_PEER_OPS=4000000000 $P --client 127.0.0.1:$port >"$log/client" 2>&1 &
cli=$!
sample() { echo "$(awk '/VmRSS/{print $2}' /proc/$1/status) $(ls /proc/$1/fd | wc -l)"; }
printf '%8s %12s %6s %12s %6s\n' t_s client_kB fds server_kB fds
t0=$(date +%s); first=""
while [ $(( $(date +%s) - t0 )) -lt "$dur" ]; do
    sleep 30
    if ! kill -0 $cli 2>/dev/null; then echo "client ended early:"; cat "$log/client"; exit 1; fi
    c=$(sample $cli); s=$(sample $srv)
    printf '%8d %12s %6s %12s %6s\n' $(( $(date +%s) - t0 )) $c $s
    now="$c $s"
    [ $(( $(date +%s) - t0 )) -ge 60 ] && [ -z "$first" ] && first="$now"
    last="$now"
done
kill $cli $srv 2>/dev/null || true
read c1 f1 s1 g1 <<<"$first"; read c2 f2 s2 g2 <<<"$last"
echo "after 1 min: client ${c1} kB ${f1} fds, server ${s1} kB ${g1} fds; at the end: client ${c2} kB ${f2} fds, server ${s2} kB ${g2} fds"
ok=1
[ "$c2" -le $(( c1 * 11 / 10 )) ] && [ "$s2" -le $(( s1 * 11 / 10 )) ] || { echo "memory grew"; ok=0; }
[ "$f2" -le "$f1" ] && [ "$g2" -le "$g1" ] || { echo "descriptors grew"; ok=0; }
[ $ok = 1 ] && echo "soak: flat" || exit 1
