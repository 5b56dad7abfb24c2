#!/usr/bin/env bash
# Starts a single-machine fleet from this checkout: fleetd on the embedded store with the
# native supervisor, examples/hello.service launched, and its state shown by fleetctl.
# Everything lives in ./.fleet, or FLEET_DEMO_DIR (state, socket, logs); `scripts/quickstart.sh
# stop` ends it.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${FLEET_DEMO_DIR:-$PWD/.fleet}"
socket="$root/fleet.sock"
export FLEETCTL_ENDPOINT="unix://$socket"

if [ "${1:-}" = "stop" ]; then
  if [ -f "$root/fleetd.pid" ]; then kill -TERM "$(cat "$root/fleetd.pid")" 2>/dev/null || true; fi
  echo "fleetd stopped"
  exit 0
fi

# Which binaries: FLEET_BIN_DIR when given; else this checkout's, built (or brought up to date)
# with the dev profile, which a demo needs no more than: from a cold cache about 3-4 minutes
# on 2 cores (a release build takes twice that), seconds once built; else fleetd and fleetctl
# installed on the PATH when there is no cargo.
bin_dir="${FLEET_BIN_DIR:-}"
if [ -z "$bin_dir" ] && ! command -v cargo >/dev/null && command -v fleetd >/dev/null && command -v fleetctl >/dev/null; then
  bin_dir="$(dirname "$(command -v fleetd)")"
  echo "using the installed binaries in $bin_dir"
fi
if [ -z "$bin_dir" ]; then
  command -v cargo >/dev/null || { echo "cargo is required to build fleet (https://rustup.rs), or set FLEET_BIN_DIR"; exit 1; }
  # etcd-client's build needs protoc and Google's well-known protos, even for a single machine
  # on the embedded store; jemalloc's (fleetd's allocator) needs make.
  if ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/descriptor.proto ] || ! command -v make >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler libprotobuf-dev make
    else
      echo "protoc, Google's well-known protos and make are required (Debian packages protobuf-compiler, libprotobuf-dev and make)"; exit 1
    fi
  fi
  if [ ! -x target/debug/fleetd ] || [ ! -x target/debug/fleetctl ]; then
    echo "building fleetd and fleetctl: about 3-4 minutes on 2 cores the first time, seconds after"
  fi
  cargo build -p fleetd -p fleetctl
  bin_dir="$PWD/target/debug"
fi
for binary in fleetd fleetctl; do
  [ -x "$bin_dir/$binary" ] || { echo "$bin_dir/$binary is missing"; exit 1; }
done
mkdir -p "$root"
if [ ! -s "$root/machine-id" ]; then
  if [ -s /etc/machine-id ]; then cp /etc/machine-id "$root/machine-id"; else od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$root/machine-id"; fi
fi
cat > "$root/fleet.conf" <<CONF
machine_id = $root/machine-id
state_dir = $root/state
api_listen = unix://$socket
metadata = "role=demo"
CONF

if [ -f "$root/fleetd.pid" ] && kill -0 "$(cat "$root/fleetd.pid")" 2>/dev/null; then
  echo "fleetd already running (pid $(cat "$root/fleetd.pid"))"
else
  nohup "$bin_dir/fleetd" -config "$root/fleet.conf" >"$root/fleetd.log" 2>&1 &
  echo $! > "$root/fleetd.pid"
  for _ in $(seq 1 100); do [ -S "$socket" ] && break; sleep 0.1; done
fi

"$bin_dir/fleetctl" start examples/hello.service
"$bin_dir/fleetctl" list-machines
"$bin_dir/fleetctl" list-units
cat <<MSG

fleet is running (log: $root/fleetd.log). Try:
  export FLEETCTL_ENDPOINT=$FLEETCTL_ENDPOINT
  $bin_dir/fleetctl journal hello.service
  $bin_dir/fleetctl start examples/hello@{1,2,3}.service
  scripts/quickstart.sh stop
MSG
