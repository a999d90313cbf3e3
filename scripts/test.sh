#!/usr/bin/env bash
# The whole uroce test suite: installs what it needs (Debian packages) when
# missing, builds everything, runs every test, and ends with one summary line.
# Usage: scripts/test.sh            (from anywhere in the repository)
# Env:   UROCE_SIM_SEEDS=N          seeds for the simulated fabric (default 300)
#        UROCE_NO_INSTALL=1         never call apt-get, never set up UCX's device node
#        CI=true                    fail when a test skips because something is not installed
# Skips: a test that cannot run prints one line `SKIP <test>: <reason>`
# (crates/uroce/tests/skip/mod.rs); it is counted as skipped, not passed. A
# part of a test skipped prints `SKIP-PART <test>: <reason>`; the test counts
# as passed and the line is listed.
set -uo pipefail
cd "$(dirname "$0")/.."

PKGS=(ibverbs-utils rdmacm-utils librdmacm-dev perftest python3-pyverbs libibverbs-dev rdma-core tshark valgrind iproute2 ethtool clang libclang-dev
      ucx-utils binutils python3-dpkt qperf libfabric-bin)

install_packages() {
    local missing=()
    for p in "${PKGS[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "${UROCE_NO_INSTALL:-0}" = 1 ]; then
        echo "skip install: UROCE_NO_INSTALL=1 (missing: ${missing[*]})"; return 0
    fi
    local SUDO=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
            echo "skip install: not root and no passwordless sudo (missing: ${missing[*]}); tests needing them will skip"; return 0
        fi
    fi
    echo "installing: ${missing[*]}"
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
        || echo "warning: apt-get could not install some of: ${missing[*]}; tests needing them will skip"
}

if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust with https://rustup.rs (curl --proto '=https' -sSf https://sh.rustup.rs | sh)" >&2
    exit 2
fi
command -v apt-get >/dev/null && install_packages

# UCX sees a verbs device only through /dev/infiniband/<dev_name>, which
# needs the directory /dev/infiniband (scripts/setup-ucx.sh says why): make
# it when we may.
if ! scripts/setup-ucx.sh --check >/dev/null && [ "${UROCE_NO_INSTALL:-0}" != 1 ]; then
    if [ "$(id -u)" = 0 ]; then scripts/setup-ucx.sh
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo -n scripts/setup-ucx.sh
    else echo "skip UCX setup: not root and no passwordless sudo; the UCX tests will skip"; fi
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# The drop-in library is built in release mode once; its tests find it there.
if [ -x scripts/build-dropin.sh ]; then
    scripts/build-dropin.sh || status=1
fi
# Two passes over every test: with the same-host link as a user gets it
# (UROCE_LINK=auto: devices of this host exchange packets through shared
# memory, crates/uroce/src/io/link), then with it off (UROCE_LINK=udp: every
# packet by UDP, as between hosts).
echo "== pass 1 of 2: UROCE_LINK=auto (same-host peers by shared memory)"
UROCE_LINK=auto cargo test --workspace --all-targets --no-fail-fast -- --show-output 2>&1 | tee "$log" || status=1
cargo test --workspace --doc --no-fail-fast 2>&1 | tee -a "$log" || status=1
log2=$(mktemp)
trap 'rm -f "$log" "$log2"' EXIT
echo "== pass 2 of 2: UROCE_LINK=udp (every packet by UDP)"
# (The tests of the link itself, crates/uroce/tests/link.rs, need it on: pass 1 runs them.)
link_tests=(two_devices_of_one_process_link_and_captures_see_every_packet two_processes_link_and_verify_their_data
            a_peer_of_another_user_is_not_linked kill_9_of_a_linked_peer_mid_transfer_gives_retry_exceeded
            a_stopped_peer_fills_its_ring_then_the_survivor_times_out_without_growing
            one_device_uses_memory_to_a_same_host_peer_and_udp_to_a_namespace_peer_at_once)
UROCE_LINK=udp cargo test --workspace --tests --no-fail-fast -- --show-output \
    $(printf -- '--skip %s ' "${link_tests[@]}") >"$log2" 2>&1 || status=1
# Its log in full only where something failed; else each binary's result line.
if grep -qE '^test result: FAILED|^error' "$log2"; then cat "$log2"; else grep -E '^(test result:|SKIP)' "$log2"; fi

# Skips counted as skips, listed with their reasons; the summary line last.
echo
echo "pass 2 (UROCE_LINK=udp): $(scripts/test-summary.sh "$log2" | tail -1)"
sed -i 's/^\(SKIP[-A-Z]* \)/\1[udp pass] /' "$log2"
cat "$log2" >> "$log"
scripts/test-summary.sh "$log" || status=1
[ $status = 0 ]
