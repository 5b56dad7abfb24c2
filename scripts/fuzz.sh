#!/usr/bin/env bash
# A long, coverage-guided fuzzing run of every target with libFuzzer (cargo-fuzz, nightly),
# for FUZZING.md: `scripts/fuzz.sh [seconds per target]` (default 300). The targets run two at
# a time; new inputs land in fuzz/corpus/<target>, which is minimised at the end; crashes
# land in fuzz/artifacts/<target>. CI runs the same targets on stable (crates/fleet-fuzz).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-300}
cargo +nightly --version >/dev/null 2>&1 || { echo "a nightly toolchain is required (rustup toolchain install nightly)"; exit 1; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo +nightly fuzz build -O
targets=$(cargo +nightly fuzz list)
run() {
  cargo +nightly fuzz run -O "$1" -- -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 \
    >"/tmp/fuzz-$1.log" 2>&1 || echo "$1: crashed, see /tmp/fuzz-$1.log and fuzz/artifacts/$1"
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)|cov: ' "/tmp/fuzz-$1.log" | tail -4 | sed "s/^/$1: /"
}
set -- $targets
while [ $# -gt 0 ]; do
  run "$1" & [ $# -gt 1 ] && run "$2" &
  wait
  shift; [ $# -gt 0 ] && shift
done
for target in $targets; do
  cargo +nightly fuzz cmin -O "$target" >/dev/null 2>&1
  echo "$target: $(ls "corpus/$target" | wc -l) inputs in the minimised corpus"
done
