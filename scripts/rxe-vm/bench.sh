#!/bin/bash
# uroce<->rxe beside rxe<->rxe (issue 26; figures in docs/benchmarks.md): two kernel-rxe VMs
# (scripts/rxe-vm/build.sh; TCG, one vCPU each, e1000) and the host's uroce on one bridge in a
# network namespace made here (198.18.0.0/24: a private link, routed nowhere). VM A serves
# perftest's write/read/send bandwidth at 64 KiB and 1 MiB twice: first to VM B (rxe client),
# then to uroce (the drop-in, with no setting). Run as root: scripts/rxe-vm/bench.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="$("$here/build.sh" | tail -1)"
dropin="${CARGO_TARGET_DIR:-$repo/target}/dropin"
[ -e "$dropin/libibverbs.so.1" ] || "$repo/scripts/build-dropin.sh" >/dev/null
ns="urxe-bench-$$"
out="$(mktemp -d)"
cleanup() { for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done; ip netns del "$ns" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
ip netns add "$ns"
nx() { ip netns exec "$ns" "$@"; }
nx ip link set lo up
nx ip link add br0 type bridge
for t in tap0 tap1; do nx ip tuntap add dev "$t" mode tap; nx ip link set "$t" master br0; nx ip link set "$t" up; done
nx ip addr add 198.18.0.1/24 dev br0
nx ip link set br0 up
# name prog size iterations
tests=("ib_write_bw 65536 100" "ib_write_bw 1048576 20" "ib_read_bw 65536 100" "ib_read_bw 1048576 20"
       "ib_send_bw 65536 100" "ib_send_bw 1048576 20")
opts="-F -u 18"
server_script="sleep 2; G=\$(for i in 0 1 2 3; do grep -q c612:0002 /sys/class/infiniband/rxe0/ports/1/gids/\$i && echo \$i; done | head -1)"
client_script="G=\$(for i in 0 1 2 3; do grep -q c612:0003 /sys/class/infiniband/rxe0/ports/1/gids/\$i && echo \$i; done | head -1)"
for round in rxe uroce; do
    for t in "${tests[@]}"; do
        set -- $t
        server_script+="; timeout 300 $1 $opts -x \$G -s $2 -n $3 >/dev/null 2>&1"
    done
done
for t in "${tests[@]}"; do
    set -- $t
    client_script+="; n=0; until timeout 300 $1 $opts -x \$G -s $2 -n $3 198.18.0.2 > /tmp/o 2>&1 || [ \$n -ge 100 ]; do n=\$((n+1)); sleep 0.3; done; echo RESULT rxe $1 \$(grep -E '^ *$2 ' /tmp/o)"
done
boot() { # name mac addr script
    nx qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m 768 -nographic -no-reboot \
        -kernel "$dir/vmlinuz" -initrd "$dir/initrd.cpio.gz" \
        -append "console=ttyS0 quiet panic=-1 uroce.addr=$3/24 uroce.cmd=$(echo "$4" | base64 -w0)" \
        -netdev tap,id=n0,ifname="$1",script=no,downscript=no -device e1000,netdev=n0,mac="$2" \
        </dev/null >"$out/$1.log" 2>&1 &
}
boot tap0 52:54:00:00:00:02 198.18.0.2 "$server_script"
boot tap1 52:54:00:00:00:03 198.18.0.3 "$client_script"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); date: $(date -u +%F)"
# rxe <-> rxe: VM B's results.
for _ in $(seq 1200); do grep -q UROCE-VM-DONE "$out/tap1.log" && break; sleep 1; done
grep RESULT "$out/tap1.log" | tr -d '\r'
# uroce <-> rxe: the same clients on the host, through the drop-in.
for t in "${tests[@]}"; do
    set -- $t
    for n in $(seq 100); do
        if nx env LD_LIBRARY_PATH="$dropin" UROCE_ADDR=198.18.0.1 timeout 300 "$1" $opts -x 0 -s "$2" -n "$3" 198.18.0.2 >"$out/o" 2>&1; then break; fi
        sleep 0.3
    done
    echo "RESULT uroce $1 $(grep -E "^ *$2 " "$out/o")"
done
