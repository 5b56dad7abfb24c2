#!/usr/bin/env bash
# Writes the fixture stores of a store format from a release's binaries: an embedded
# registry.redb and an etcd key dump, each holding units (a template, instances, a global unit,
# every desired state), a machine's metadata override, API tokens, a registration token, a git
# source and a rollout, with what that release's API answered about them. The current fleetd
# must read them as they are (crates/fleet-e2e/tests/e2e/format_fixtures.rs).
#
#   git worktree add /tmp/v0.1.0 v0.1.0 && (cd /tmp/v0.1.0 && cargo build -p fleetd -p fleetctl)
#   scripts/make-format-fixtures.sh /tmp/v0.1.0/target/debug 1
#
# Needs etcd (Debian's etcd-server), git and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
old="$(cd "$1" && pwd)"
format="$2"
out="$PWD/crates/fleet-e2e/fixtures/format-$format"
work="$(mktemp -d)"
pids=()
trap 'for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done; rm -rf "$work"' EXIT
mkdir -p "$out" "$work/units" "$work/repo/units"
version="$("$old/fleetd" --version | head -n 1)"

# The unit files, and a repository of one unit for the source.
printf '[Unit]\nDescription=web %%i\n[Service]\nExecStart=/bin/sleep 100%%i\n[X-Fleet]\nMachineMetadata=role=web\n' > "$work/units/web@.service"
printf '[Service]\nExecStart=/bin/sleep 2000\n' > "$work/units/plain.service"
printf '[Service]\nExecStart=/bin/sleep 3000\n[X-Fleet]\nGlobal=true\n' > "$work/units/global.service"
printf '[Service]\nExecStart=/bin/sleep 4000\n' > "$work/repo/units/from-git.service"
git -C "$work/repo" init -q -b main && git -C "$work/repo" add -A \
  && git -C "$work/repo" -c user.name=fixture -c user.email=fixture@localhost commit -qm fixture

# Waits until `$1` (a command) succeeds, for at most 60 s. Output is read whole before it is
# searched: fleet 0.1.0's fleetctl panics when a reader stops early (`| grep -q`).
wait_for() {
  for _ in $(seq 1 600); do if eval "$1" >/dev/null 2>&1; then return 0; fi; sleep 0.1; done
  echo "timed out waiting for: $1" >&2; exit 1
}

# Fills the store of the fleetd at socket $1, then saves what its API says into $2.
populate() {
  local socket="$1" saved="$2"
  export FLEETCTL_ENDPOINT="unix://$socket"
  local fleetctl="$old/fleetctl"
  wait_for "$fleetctl list-machines"
  (cd "$work/units" && "$fleetctl" submit web@.service global.service >/dev/null \
    && "$fleetctl" load web@1.service >/dev/null \
    && "$fleetctl" start --no-block plain.service web@2.service web@3.service >/dev/null)
  "$fleetctl" token create --role viewer fixture-viewer >/dev/null
  "$fleetctl" token create --role operator --units 'web@*' fixture-operator >/dev/null
  "$fleetctl" registration-token create --metadata rack=r1 fixture-join >/dev/null
  "$fleetctl" source add --repo "file://$work/repo" --interval 1h fixture-git >/dev/null
  wait_for "$fleetctl list-unit-files --no-legend > $work/out && grep -q from-git.service $work/out"
  local machine
  machine="$("$fleetctl" list-machines --full --no-legend --fields machine | sed -n 1p)"
  curl -sf --unix-socket "$socket" -X PATCH -H 'Content-Type: application/json' \
    -d "[{\"op\":\"add\",\"path\":\"/$machine/metadata/zone\",\"value\":\"z1\"}]" http://localhost/fleet/v1/machines >/dev/null
  wait_for "$fleetctl list-units --no-legend > $work/out && grep web@3.service $work/out | grep -q running"
  # A rollout of new content for the running instances, paused so that it stays as it is.
  mkdir -p "$work/units/next"
  sed 's/100%i/200%i/' "$work/units/web@.service" > "$work/units/next/web@.service"
  "$fleetctl" rollout start --max-unavailable 1 --min-ready 1h "$work/units/next/web@.service" >/dev/null 2>&1
  # Paused until it stays paused: fleet 0.1.0's driver could write a step over a pause on etcd.
  wait_for "$fleetctl rollout pause web; sleep 0.5; $fleetctl rollout status web > $work/out && grep -q 'State: *paused' $work/out"
  mkdir -p "$saved"
  for resource in units machines tokens registration-tokens sources rollouts; do
    curl -sf --unix-socket "$socket" "http://localhost/fleet/v1/$resource" > "$saved/$resource.json"
  done
}

# Starts the old fleetd as machine $2 in $work/$1, with the fleet.conf lines that follow.
start_fleetd() {
  local dir="$work/$1" machine="$2"
  shift 2
  mkdir -p "$dir"
  printf '%s\n' "machine_id = $machine" "state_dir = $dir/state" "api_listen = unix://$dir/fleet.sock" \
    "unit_manager = native" "metadata = role=web" "$@" > "$dir/fleet.conf"
  "$old/fleetd" -config "$dir/fleet.conf" > "$dir/fleetd.log" 2>&1 &
  pids+=($!)
}

# The embedded store: fleetd killed once it is full, so that nothing is undone by a clean stop.
start_fleetd embedded fixture0machine01
populate "$work/embedded/fleet.sock" "$out/embedded"
kill -9 "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
cp "$work/embedded/state/registry.redb" "$out/registry.redb"

# The etcd store: its keys under fleet's prefix, dumped through etcd's JSON gateway.
port=$((20000 + RANDOM % 20000))
etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$((port + 1))" > "$work/etcd.log" 2>&1 &
pids+=($!)
wait_for "curl -sf http://127.0.0.1:$port/health"
start_fleetd member fixture0machine02 "etcd_servers = http://127.0.0.1:$port"
populate "$work/member/fleet.sock" "$out/etcd"
kill -9 "${pids[-1]}"
prefix="$(printf '/_coreos.com/fleet/' | base64 -w0)"
end="$(printf '/_coreos.com/fleet0' | base64 -w0)"
# Leased keys (presences, states) go: a restarted cluster has none of them either.
curl -sf -X POST "http://127.0.0.1:$port/v3/kv/range" -d "{\"key\":\"$prefix\",\"range_end\":\"$end\"}" > "$work/range.json"
python3 - "$work/range.json" "$out/etcd-keys.json" <<'PY'
import json, sys
kvs = json.load(open(sys.argv[1])).get("kvs", [])
kept = [{"key": kv["key"], "value": kv.get("value", "")} for kv in kvs if kv.get("lease", "0") in ("0", 0)]
json.dump(kept, open(sys.argv[2], "w"), indent=1)
PY
echo "$version" > "$out/VERSION"
echo "fixtures of store format $format written to $out by $version"
