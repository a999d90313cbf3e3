#!/usr/bin/env bash
# The whole uroce test suite: installs what it needs (Debian packages) when
# missing, builds everything, runs every test, and ends with one summary line.
# Usage: scripts/test.sh            (from anywhere in the repository)
# Env:   UROCE_SIM_SEEDS=N          seeds for the simulated fabric (default 300)
#        UROCE_NO_INSTALL=1         never call apt-get, never set up UCX's device node
#        CI=true                    fail when a test skips because something is not installed
#        UROCE_TEST_STALL=S         kill a test binary none of whose tests finished for S s (default 900)
# Skips: a test that cannot run prints one line `SKIP <test>: <reason>`
# (crates/uroce/tests/skip/mod.rs); it is counted as skipped, not passed. A
# part of a test skipped prints `SKIP-PART <test>: <reason>`; the test counts
# as passed and the line is listed.
set -uo pipefail
cd "$(dirname "$0")/.."

PKGS=(ibverbs-utils rdmacm-utils librdmacm-dev perftest python3-pyverbs libibverbs-dev rdma-core tshark valgrind iproute2 ethtool clang libclang-dev
      ucx-utils binutils python3-dpkt libfabric1 libfabric-bin libfabric-dev qemu-system-x86 busybox-static qperf
      openmpi-bin libopenmpi-dev mpich libmpich-dev)

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
    # Another apt (an unattended upgrade, a second test run) may hold the
    # package lock: wait for it rather than fail.
    local lock=(-o DPkg::Lock::Timeout=900)
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" update -qq >/dev/null 2>&1 || true
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq "${missing[@]}" >/dev/null 2>&1 \
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
# Formatting and lints first, each counted as one test in the summary line.
checks=$(mktemp)
trap 'rm -f "$log" "$checks"' EXIT
check() {
    local name=$1; shift
    echo "== $name"
    if out=$("$@" 2>&1); then
        echo "test result: ok. 1 passed; 0 failed; 0 ignored ($name)" >> "$checks"
    else
        printf '%s\n' "$out" | tail -80
        echo "test result: FAILED. 0 passed; 1 failed; 0 ignored ($name)" | tee -a "$checks"
        status=1
    fi
}
check "cargo fmt --all -- --check" cargo fmt --all -- --check
check "cargo clippy --workspace --all-targets -- -D warnings" cargo clippy --workspace --all-targets -q -- -D warnings
# The library as a Rust application gets it (no `unstable` feature: the
# internal modules private): nothing dead, every public item documented.
check "cargo clippy -p uroce --lib (no unstable) -- -D warnings" cargo clippy -p uroce --lib -q -- -D warnings
check "cargo doc -p uroce (no broken links)" env RUSTDOCFLAGS="-D warnings" cargo doc -p uroce --no-deps -q
# The internals' docs too, as uroce's developers read them (links to private
# items are theirs to follow).
check "cargo doc -p uroce --features unstable --document-private-items (no broken links)" \
    env RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links --document-private-items" \
    cargo doc -p uroce --no-deps -q --features unstable --target-dir target/doc-internal
check "cargo doc -p uroce-ibverbs --document-private-items (no broken links)" \
    env RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links --document-private-items" \
    cargo doc -p uroce-ibverbs --no-deps -q --target-dir target/doc-internal
# The drop-in library is built in release mode once; its tests find it there.
if [ -x scripts/build-dropin.sh ]; then
    scripts/build-dropin.sh || status=1
fi
# Two passes over every test: with the same-host link as a user gets it
# (UROCE_LINK=auto: devices of this host exchange packets through shared
# memory, crates/uroce/src/io/link), then with it off (UROCE_LINK=udp: every
# packet by UDP, as between hosts).
# A hung test must not eat the whole CI budget: while a pass runs, a
# watchdog kills the test binary that has let its log stand still for
# UROCE_TEST_STALL seconds (no test of it finished; the slowest single test,
# the kernel-rxe matrix, takes 5 minutes alone). The killed binary shows in
# cargo's output as "(signal: 9, SIGKILL: kill)" and counts as one failure
# (scripts/test-summary.sh); the tests still running in it are named.
stall=${UROCE_TEST_STALL:-900}
watchdog() {
    local log=$1 deps="$PWD/target/debug/deps/"
    while sleep 20; do
        local age=$(( $(date +%s) - $(stat -c %Y "$log" 2>/dev/null || date +%s) ))
        [ "$age" -lt "$stall" ] && continue
        for pid in $(pgrep -f "^$deps"); do
            local name; name=$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")
            echo "WATCHDOG: killed $name: no test finished for $age s (UROCE_TEST_STALL=$stall); still running:" \
                "$(tail -c 2000 "$log" | grep -oE 'test [^ ]+ has been running' | awk '{print $2}' | sort -u | tr '\n' ' ')" \
                | tee -a "$log" >&2
            pkill -9 -P "$pid"; kill -9 "$pid"
        done
        touch "$log"
    done
}
echo "== pass 1 of 2: UROCE_LINK=auto (same-host peers by shared memory)"
# Not --all-targets: that would run the benches (harness = false: their
# main) as timed tests; they are measurements (`cargo bench`), compiled and
# linted above by clippy --all-targets.
watchdog "$log" & wd=$!
UROCE_LINK=auto cargo test --workspace --lib --bins --tests --examples --no-fail-fast -- --show-output 2>&1 | tee "$log" || status=1
kill $wd
cargo test --workspace --doc --no-fail-fast 2>&1 | tee -a "$log" || status=1
log2=$(mktemp)
trap 'rm -f "$log" "$log2" "$checks"' EXIT
echo "== pass 2 of 2: UROCE_LINK=udp (every packet by UDP)"
# (The tests of the link itself, crates/uroce/tests/link.rs and link_attacks.rs, need it on:
# pass 1 runs them.)
link_tests=(two_devices_of_one_process_link_and_captures_see_every_packet two_processes_link_and_verify_their_data
            a_peer_of_another_user_is_not_linked kill_9_of_a_linked_peer_mid_transfer_gives_retry_exceeded
            a_stopped_peer_fills_its_ring_then_the_survivor_times_out_without_growing
            one_device_uses_memory_to_a_same_host_peer_and_udp_to_a_namespace_peer_at_once
            a_claim_of_another_devices_address_is_refused_both_ways a_doorbell_that_would_block_does_not_freeze_the_victim
            a_fake_socket_that_never_accepts_and_a_stopped_peer_do_not_stall_traffic
            link_attempts_beyond_the_cap_are_refused_and_reaped links_from_many_owned_addresses_stop_at_the_device_cap
            a_socket_file_left_by_a_killed_process_is_reaped)
# (And tests where no packet travels between two live devices run once: a
# client of a dead server waits 74 s for the CM's 16 tries either way.)
# The kernel-rxe VM test (crates/uroce-ibverbs/tests/kernel_rxe.rs) has no
# same-host peer: every packet goes by UDP in pass 1 already.
# The wait-latency programs go by UDP in both passes (tests/wait_latency.rs).
once_tests=(rping_to_a_killed_server_is_unreachable kernel_rxe_matrix_both_ways
            event_driven_uc_and_ud_pingpongs_stay_near_polled_rc qperf_rc_lat_event_driven_stays_near_polled)
watchdog "$log2" & wd=$!
UROCE_LINK=udp cargo test --workspace --tests --no-fail-fast -- --show-output \
    $(printf -- '--skip %s ' "${link_tests[@]}" "${once_tests[@]}") >"$log2" 2>&1 || status=1
kill $wd
# Its log in full only where something failed; else each binary's result line.
if grep -qE '^test result: FAILED|^error' "$log2"; then cat "$log2"; else grep -E '^(test result:|SKIP)' "$log2"; fi

# Skips counted as skips, listed with their reasons; the summary line last.
echo
echo "pass 2 (UROCE_LINK=udp): $(scripts/test-summary.sh "$log2" | tail -1)"
sed -i 's/^\(SKIP[-A-Z]* \)/\1[udp pass] /' "$log2"
cat "$log2" "$checks" >> "$log"
scripts/test-summary.sh "$log" || status=1
[ $status = 0 ]
