#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every unit, property and end-to-end test
# of the workspace (the end-to-end tests run the real fleetd and fleetctl binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
# The socket-activation test passes real sockets with Debian's systemd-socket-activate.
if ! command -v systemd-socket-activate >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd
  else
    echo "systemd-socket-activate is required (Debian package systemd)"; exit 1
  fi
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo build --workspace --bins --quiet
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
