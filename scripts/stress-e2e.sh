#!/bin/bash
# Runs some end-to-end tests over and over beside two busy-looping spinners (the load CI's
# replicas see), four at a time, until one fails or SECONDS pass; prints each failure.
# A fleetd that does not exit when its test stops it has its threads' stacks in the output;
# the stalls fleetds logged in tests that passed are printed after each round.
#   scripts/stress-e2e.sh [SECONDS] [FILTER...]   (default 900 s; rollouts disruption_budgets drain required_places)
# STRESS_THREADS sets how many tests run at once (default 4, as CI).
set -u
cd "$(dirname "$0")/.."
seconds=${1:-900}
shift || true
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=(rollouts disruption_budgets drain required_places)
cargo build -p fleetd -p fleetctl --quiet || exit 1
( while :; do :; done ) & s1=$!
( while :; do :; done ) & s2=$!
trap 'kill $s1 $s2 2>/dev/null' EXIT
renice -n 19 -p $s1 $s2 >/dev/null
out=$(mktemp -d)
end=$(( $(date +%s) + seconds ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  if ! cargo nextest run -p fleet-e2e --test e2e --test-threads "${STRESS_THREADS:-4}" --no-fail-fast \
    --success-output immediate "${filters[@]}" > "$out/round-$round.log" 2>&1; then
    echo "round $round failed: $out/round-$round.log"
    grep -E "^\s+(FAIL|SIGABRT|TIMEOUT) \[" "$out/round-$round.log"
    exit 1
  fi
  # A fleetd that nearly wedged in a test that passed (fleet-e2e's STALL_PREFIX).
  grep -h "fleetd stalled: " "$out/round-$round.log" | sed "s/^/round $round: /"
  echo "round $round passed"
done
