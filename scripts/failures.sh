#!/usr/bin/env bash
# failures.sh LOG: the failed tests of a `go test` log and what each one
# asserted, printed last, so that a CI page that keeps only the tail of
# the output still says which assertion failed and with what numbers.
set -euo pipefail
log=${1:?usage: scripts/failures.sh LOG}
echo "--- failed tests in $log, and their assertions:"
grep -E '^\s*--- FAIL|^\s+(Error|Messages|Test):|^panic:|^FAIL\s' "$log" | cut -c1-500 || true
