#!/usr/bin/env bash
# Builds the Debian package fleet_<version>_<arch>.deb into target/debian/ (or OUT_DIR):
# fleetd and fleetctl, their manual pages and shell completions, fleet.service and
# fleet.socket (the socket 0660 for the fleet group), a commented /etc/fleet/fleet.conf (a
# conffile), and the maintainer scripts in dist/debian. Needs dpkg-deb (Debian's dpkg).
#
#   scripts/deb.sh                              build the release binaries, then the package
#   FLEET_BINARIES=target/debug scripts/deb.sh  package binaries built already
#   DEB_COMPRESSION=none scripts/deb.sh         dpkg-deb's compression (default xz)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v dpkg-deb >/dev/null || { echo "dpkg-deb is required (Debian package dpkg)"; exit 1; }
binaries="${FLEET_BINARIES:-}"
if [ -z "$binaries" ]; then
  cargo build --release -p fleetd -p fleetctl
  binaries=target/release
fi
version="$("$binaries/fleetd" --version | sed -n 's/^fleetd version //p')"
arch="$(dpkg --print-architecture)"
out="${OUT_DIR:-target/debian}"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/fleet_${version}_$arch"

FLEET_BINARIES="$binaries" PREFIX=/usr DESTDIR="$root" UNITDIR=/lib/systemd/system SOCKET_GROUP=fleet \
  scripts/install.sh >/dev/null
# Debian's places: compressed manuals, zsh's vendor completions, the documents.
gzip -9n "$root"/usr/share/man/man*/*
install -d -m 0755 "$root/usr/share/zsh/vendor-completions" "$root/usr/share/doc/fleet"
mv "$root/usr/share/zsh/site-functions/_fleetctl" "$root/usr/share/zsh/vendor-completions/_fleetctl"
rmdir "$root/usr/share/zsh/site-functions"
gzip -9nc CHANGELOG.md > "$root/usr/share/doc/fleet/changelog.gz"
install -m 0644 README.md "$root/usr/share/doc/fleet/README.md"
printf 'fleet %s\nLicense: Apache-2.0 (/usr/share/common-licenses/Apache-2.0)\n' "$version" \
  > "$root/usr/share/doc/fleet/copyright"
chmod 0644 "$root/usr/share/doc/fleet/copyright"

install -d -m 0755 "$root/DEBIAN"
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" dist/debian/control > "$root/DEBIAN/control"
echo /etc/fleet/fleet.conf > "$root/DEBIAN/conffiles"
install -m 0755 dist/debian/postinst dist/debian/prerm dist/debian/postrm "$root/DEBIAN/"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles"

mkdir -p "$out"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$root" "$out/fleet_${version}_$arch.deb" >/dev/null
echo "$out/fleet_${version}_$arch.deb"
