#!/usr/bin/env bash
# Lists stay linear in the units listed (issue 71): a row of `fleetctl list-unit-files` or
# `list-units` at 10,000 units on 1,000 machines may cost at most twice a row at 1,000 units
# on 100 machines. BIG_LOG is the output of CI's `bench-cluster 1000 10000 …` run; the small
# run is made here. (A row's machine legend compared every machine ID once: 22 s lists.)
set -euo pipefail
big_log=$1
small_log=$(mktemp)
trap 'rm -f "$small_log"' EXIT
target/debug/bench-cluster 100 1000 1 lists-only > "$small_log"
# "(d) fleetctl list-units: 10000 rows in 2.47 s" -> microseconds per row
per_row() {
  awk -v list="$2:" '$1 == "(d)" && $3 == list { printf "%.1f\n", $7 / $4 * 1e6 }' "$1"
}
for list in list-unit-files list-units; do
  small=$(per_row "$small_log" "$list")
  big=$(per_row "$big_log" "$list")
  [ -n "$small" ] && [ -n "$big" ] || { echo "list-linearity: no $list figures (small: '$small', big: '$big')"; exit 1; }
  echo "list-linearity: $list ${small} µs a row at 1,000 units, ${big} µs at 10,000"
  awk -v small="$small" -v big="$big" 'BEGIN { exit !(big <= 2 * small) }' || {
    echo "list-linearity: a row of $list at 10,000 units costs more than twice one at 1,000"
    exit 1
  }
done
