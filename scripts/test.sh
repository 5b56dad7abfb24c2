#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every unit, property and end-to-end test
# of the workspace (the end-to-end tests run the real fleetd and fleetctl binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
# What the build and the tests need from Debian: protoc and its well-known types (etcd-client's build), a real etcd
# (the etcd store's tests and the cluster tests), systemd (systemd-socket-activate for the
# socket-activation test; systemd --user and journald for the systemd unit manager's tests),
# dbus-daemon (their session bus), openssl (certificates for the TLS tests), iproute2,
# iptables and nftables (the pull-agent tests put agents behind a NAT of network namespaces;
# the partition tests cut and degrade links between namespaces), prometheus
# (promtool checks every /metrics scrape of the tests), groff-base (the manual pages must format
# without a warning), openssh (fleetctl ssh and --tunnel against a real sshd and ssh-agent),
# chromium (the web view in a real headless browser), bsdutils (`script`: fleetctl on a terminal),
# git (the git-source tests make real repositories; fetching file:// runs git-upload-pack),
# tzdata (systemd-analyze reads the calendar tests' time zones from it).
missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
# jemalloc, fleetd's allocator, is built from its C sources by make.
command -v make >/dev/null || missing+=(make)
# etcd-client's protos import Google's well-known types, which only libprotobuf-dev ships
# (protobuf-compiler merely recommends it, and recommends are not installed here).
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
[ -x /usr/bin/etcd ] || missing+=(etcd-server)
command -v systemd-socket-activate >/dev/null && [ -x /usr/lib/systemd/systemd ] || missing+=(systemd)
command -v dbus-daemon >/dev/null || missing+=(dbus-daemon)
command -v openssl >/dev/null || missing+=(openssl)
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
command -v nft >/dev/null || missing+=(nftables)
command -v promtool >/dev/null || missing+=(prometheus)
command -v groff >/dev/null || missing+=(groff-base)
[ -x /usr/sbin/sshd ] && command -v ssh-agent >/dev/null || missing+=(openssh-server openssh-client)
command -v chromium >/dev/null || missing+=(chromium)
command -v script >/dev/null || missing+=(bsdutils)
command -v git-upload-pack >/dev/null || missing+=(git)
# IANA's zone files: the calendar tests read expressions in zones through systemd-analyze.
[ -f /usr/share/zoneinfo/Europe/Berlin ] || missing+=(tzdata)
# gdb: a fleetd that does not exit when a test stops it has its threads' stacks printed.
command -v gdb >/dev/null || missing+=(gdb)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "these Debian packages are required: ${missing[*]}"; exit 1
  fi
fi
# A fresh checkout (CI's) builds everything once: incremental caches only cost it time.
[ -d "${CARGO_TARGET_DIR:-target}/debug" ] || export CARGO_INCREMENTAL=0
# A clean build of the whole tree takes about 6 GB. A disk that fills while linking shows
# only as a linker killed by SIGBUS, so say beforehand when the room looks short.
free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kb:-0}" -lt $((8 * 1024 * 1024)) ]; then
  echo "test.sh: only $((free_kb / 1024)) MB free here; a clean build needs about 6 GB" >&2
fi
# Each step says how long it took, so the suite's time is known where it goes.
step() {
  local started=$SECONDS
  "$@"
  echo "test.sh: $* took $((SECONDS - started)) s" >&2
}
step cargo fmt --all -- --check
# Every target at once, tests included: the tests' dev-dependencies turn on features of shared
# crates (tempfile's, regex's, tracing-subscriber's), and binaries built without them would
# build gix and its fifty crates a second time for the tests. So nextest finds it all built.
step cargo build --workspace --all-targets --quiet
# The deterministic simulation of the protocol (the real engine and agents over a simulated
# store, under seeded faults): 700 seeds from one drawn now, printed with any that fails (a
# fresh slice each run; the release runs of tens of thousands are in BENCHMARKS.md). Besides
# the 24 services of every run, four units on a calendar (each elapse run at most once and
# every one accounted for: run, waiting or skipped with its reason) and three services that
# fail on m0 and move (each ends running elsewhere, or off with its retries spent having failed
# on m0 only; never recorded failed where it did not fail), eight units with priorities and six
# with LostAfter= (none moved off a machine gone before its span). One run covers what a plain run
# checks, so there is no plain run besides.
# It only computes, and the tests mostly wait: it runs beside them at the lowest priority, on
# the cores they leave idle (under nice 19 a test loses about 1% of a core to it), and its
# answer is waited for at the end.
sim_log=$(mktemp)
sim_started=$SECONDS
nice -n 19 target/debug/fleet-sim --scheduled 4 --moving 3 --prioritized 8 --lost-after 6 --budgeted 6 --dependent 6 700 >"$sim_log" 2>&1 &
sim=$!
# The lints, likewise: clippy compiles as much as the build (about 190 s on 2 cores) and only
# computes, so it checks the tree beside the tests too, in a target directory of its own (a
# cargo holding the tests' would keep nextest from starting), and its verdict is waited for at
# the end.
clippy_log=$(mktemp)
clippy_started=$SECONDS
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/clippy" nice -n 19 \
  cargo clippy --workspace --all-targets --quiet -- -D warnings >"$clippy_log" 2>&1 &
clippy=$!
trap 'kill "$sim" "$clippy" 2>/dev/null || true' EXIT
if cargo nextest --version >/dev/null 2>&1; then
  step cargo nextest run --workspace --no-fail-fast
else
  step cargo test --workspace --no-fail-fast
fi
# A bounded slice of the API benchmark: every listener kind answers its requests correctly, and
# HTTPS answers at least half as many as plain HTTP (a debug build's figures on a busy machine say
# little more; BENCHMARKS.md has release figures).
step target/debug/bench-api 0.2 2
# And of the pull-agent benchmark: join, schedule, wake, idle and manager restart all complete;
# then with two managers sharing the agents, one of them killed: its agents move to the other
# without leaving the cluster, and no unit moves.
step target/debug/bench-pull 20 200 1
step target/debug/bench-pull 20 200 1 2
# And of the web view's: a real Chromium follows a fleetd of 300 units.
step target/debug/bench-web 300 1
# And of the event followers': 40 followers over HTTPS stream, sit idle and are each told of a
# write (the 1,000-follower figures are in BENCHMARKS.md).
step target/debug/bench-events 40 2
# And the whole path at 1,000 simulated machines and 10,000 units on one etcd (issue 14's CI
# size): fleetctl submits and lists them all, one change wakes one agent, a tenth of the
# machines lost at once and a killed engine leader leave every unit running once; then a
# health-gated rollout of every unit completes and a failing version reverts itself.
big_bench=$(mktemp)
step bash -c 'set -o pipefail; target/debug/bench-cluster 1000 10000 5 reserve health | tee "$0"' "$big_bench"
# Its lists against a tenth of the cluster: a row may cost at most twice as much at ten times the
# units (issue 71: lists that grew with units × machines took 22 s at 100,000).
step scripts/list-linearity.sh "$big_bench"
# Units on a calendar all due at one second, on 20 simulated machines: each started exactly once
# for its elapse (the 1,000-machine figures are in BENCHMARKS.md).
step target/debug/bench-calendar 20 200
# A rolling upgrade of three members under systemd while units are submitted, each member
# replaced in place: no unit restarted or lost, some member's API answering throughout (the run
# from the previous release is in BENCHMARKS.md: building it here costs more than it is worth).
step target/debug/bench-upgrade target/debug/fleetd 20 20
clippy_status=0
wait "$clippy" || clippy_status=$?
cat "$clippy_log"
rm -f "$clippy_log"
echo "test.sh: clippy, beside the tests, took $((SECONDS - clippy_started)) s" >&2
sim_status=0
wait "$sim" || sim_status=$?
cat "$sim_log"
rm -f "$sim_log"
echo "test.sh: the simulation, beside the tests, took $((SECONDS - sim_started)) s" >&2
if [ "$clippy_status" != 0 ]; then
  echo "test.sh: clippy found something (exit $clippy_status)" >&2
fi
if [ "$sim_status" != 0 ]; then
  echo "test.sh: the simulation failed (exit $sim_status)" >&2
fi
[ "$clippy_status" = 0 ] && [ "$sim_status" = 0 ] || exit 1
