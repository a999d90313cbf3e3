#!/usr/bin/env bash
# The end of scripts/test.sh: reads the output of `cargo test ... --
# --show-output` (LOG) and prints the skips and the summary line, last:
#   N passed, N failed, N skipped
# A test that printed `SKIP <test>: <reason>` (crates/uroce/tests/skip) passed
# for libtest: it is moved from the passes to the skips. `SKIP-PART` lines
# (a part of a test skipped; the test counts as passed) are listed. With
# CI=true, a skip whose reason says "is not installed" fails (CI installs
# every package, so it means an install step is missing).
# Exit status: 1 when a test failed or CI saw such a skip, else 0.
# Usage: scripts/test-summary.sh LOG
set -uo pipefail
log=$1
status=0
sum() { grep -E '^test result:' "$log" | grep -oE "[0-9]+ $1" | awk '{s+=$1} END {print s+0}'; }
passed=$(sum passed); failed=$(sum failed); ignored=$(sum ignored)
skipped_whole=$(grep -cE '^SKIP ' "$log")
passed=$((passed - skipped_whole)); skipped=$((ignored + skipped_whole))
# A test binary that died of a signal (a crash, or scripts/test.sh's
# watchdog) printed no result line: each counts as one failure.
crashed=$(grep -cE "process didn't exit successfully: .*\(signal: " "$log")
failed=$((failed + crashed))
echo
echo "skipped tests ($skipped_whole, with reasons; $ignored more marked #[ignore]):"
grep -E '^SKIP ' "$log" | sort | sed 's/^/  /' || echo "  none"
if [ "$crashed" != 0 ]; then
    echo "test binaries that died of a signal ($crashed, each counted as one failure):"
    grep -E "process didn't exit successfully: .*\(signal: |^WATCHDOG" "$log" | sed 's/^/  /'
fi
echo "partly skipped tests (counted as passed):"
grep -E '^SKIP-PART ' "$log" | sort | sed 's/^/  /' || echo "  none"
if [ "${CI:-}" = true ] && grep -qE '^SKIP(-PART)? .*is not installed' "$log"; then
    echo "CI: these tests skipped for something not installed (an install step is missing):"
    grep -E '^SKIP(-PART)? .*is not installed' "$log" | sed 's/^/  /'
    status=1
fi
# What each failed test printed last (its panic message), here at the end
# where a CI log's tail shows it: libtest's "failures:" sections, each cut
# to its last 30 lines of at most 300 characters.
if [ "$failed" != 0 ]; then
    echo
    echo "failed tests, with the end of what each printed:"
    awk '
        function flush() { if (name != "") { s = (n > 30) ? n - 29 : 1; print "  ---- " name; for (i = s; i <= n; i++) print "  | " substr(buf[i], 1, 300) } name = ""; n = 0 }
        /^failures:$/ { flush(); infail = 1; next }
        /^(successes:|test result:)/ { flush(); infail = 0; next }
        infail && /^---- .* stdout ----$/ { flush(); name = $2; next }
        infail && name != "" { buf[++n] = $0 }
        END { flush() }
    ' "$log"
fi
echo
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$failed" = 0 ] && [ $status = 0 ]
