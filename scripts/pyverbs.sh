#!/usr/bin/env bash
# Runs Debian's rdma-core pyverbs tests (python3-pyverbs) on uroce through the
# drop-in library, one process per module, and prints a table, every skip
# reason with its count, and a totals line (the last line):
#   TOTAL tests=N passed=N skipped=N failed=N errors=N
# What failed or errored goes to standard error.
# Usage: scripts/pyverbs.sh [module ...]   (default: every module of the suite)
# Env:   UROCE_PYVERBS_ADDR   the device's address (default 127.0.0.97)
#        UROCE_PYVERBS_CM_ADDRS test_rdmacm's passive, active and parent
#                               devices (default "127.0.0.98 127.0.0.99 127.0.0.100")
set -uo pipefail
cd "$(dirname "$0")/.."
src=/usr/share/doc/rdma-core/tests
if [ ! -d "$src" ] || ! /usr/bin/python3 -c 'import pyverbs' 2>/dev/null; then
    echo "SKIP pyverbs: python3-pyverbs is not installed"; exit 0
fi
lib="$(scripts/build-dropin.sh)" || exit 1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/tests" && gunzip -f "$work"/tests/*.gz 2>/dev/null
mods=("$@")
if [ ${#mods[@]} -eq 0 ]; then
    for f in "$work"/tests/test_*.py; do mods+=("$(basename "$f" .py)"); done
fi
# test_odp's huge-page tests need 2 MiB pages: reserve a few for the run
# when we may (root), and give them back afterwards.
hp=/proc/sys/vm/nr_hugepages
if [ "$(id -u)" = 0 ] && [ -w $hp ] && [ "$(cat $hp)" = 0 ]; then
    echo 32 > $hp 2>/dev/null && trap 'echo 0 > '$hp'; rm -rf "$work"' EXIT
fi
T=0 P=0 S=0 F=0 E=0
reasons="$work/reasons"
: > "$reasons"
printf '%-24s %6s %6s %6s %6s %6s\n' module tests pass skip fail error
# test_rdmacm runs through scripts/pyverbs_cm.py: the same tests, each side
# a process with its own device (addresses UROCE_PYVERBS_CM_ADDRS), since
# rdma-core's harness finds the address in sysfs and puts both sides on it.
cp scripts/pyverbs_cm.py "$work/tests/"
for m in "${mods[@]}"; do
    runner=(run_tests.py -v "$m")
    [ "$m" = test_rdmacm ] && runner=(pyverbs_cm.py -v)
    out=$(cd "$work/tests" && LD_LIBRARY_PATH="$(dirname "$lib")" UROCE_ADDR="${UROCE_PYVERBS_ADDR:-127.0.0.97}" \
        timeout 300 /usr/bin/python3 "${runner[@]}" 2>&1)
    rc=$?
    t=$(grep -oE '^Ran [0-9]+' <<<"$out" | grep -oE '[0-9]+' || echo 0)
    s=$(grep -oE 'skipped=[0-9]+' <<<"$out" | grep -oE '[0-9]+' || echo 0)
    f=$(grep -oE 'failures=[0-9]+' <<<"$out" | grep -oE '[0-9]+' || echo 0)
    e=$(grep -oE 'errors=[0-9]+' <<<"$out" | grep -oE '[0-9]+' || echo 0)
    if [ "$rc" -gt 1 ]; then echo "$m: exit status $rc (crash or timeout)"; e=$((e + 1)); fi
    # unittest -v: "test_x (tests.test_m.Class.test_x) ... skipped 'reason'"
    # ("reason" in double quotes when it holds an apostrophe).
    grep -oE "skipped ('.*'|\".*\")$" <<<"$out" | sed -E "s/^skipped ['\"](.*)['\"]$/\1/" | sed "s/^/$m: /" >> "$reasons"
    # What failed, on standard error (the table stays on standard output).
    if [ $((f + e)) -gt 0 ]; then
        awk '/^(ERROR|FAIL):/{p=1} /^-{20,}$/{if(p)n++} p{print} n>=2{p=0;n=0}' <<<"$out" >&2
    fi
    p=$((t - s - f - e)); [ $p -lt 0 ] && p=0
    printf '%-24s %6d %6d %6d %6d %6d\n' "$m" "$t" "$p" "$s" "$f" "$e"
    T=$((T + t)) P=$((P + p)) S=$((S + s)) F=$((F + f)) E=$((E + e))
done
echo "skip reasons (count, module: reason):"
sort "$reasons" | uniq -c | sort -k2,2 -k1,1nr
echo "TOTAL tests=$T passed=$P skipped=$S failed=$F errors=$E"
