#!/bin/sh
# Writes the options every unit-file section of the installed systemd knows, one
# `Section.Name` a line, from the table systemd's own parser is built from (compiled into
# libsystemd-core): what fleet warns against at submission
# (crates/fleet-core/src/unknown_options/systemd.txt). Run it on a machine with the systemd
# the list should follow, and say which in the file's first line.
set -eu
core=$(ls /usr/lib/*/systemd/libsystemd-core-*.so /lib/systemd/libsystemd-core-*.so 2>/dev/null | head -n 1)
[ -n "$core" ] || { echo "no libsystemd-core here" >&2; exit 1; }
version=$(basename "$core" .so | sed 's/libsystemd-core-//')
out=crates/fleet-core/src/unknown_options/systemd.txt
{
    echo "# systemd $version: written by scripts/systemd-options.sh"
    strings "$core" \
        | grep -E '^(Unit|Install|Service|Socket|Timer|Mount|Automount|Swap|Path|Slice|Scope)\.[A-Za-z0-9]+$' \
        | LC_ALL=C sort -u
} > "$out"
echo "$out: $(grep -vc '^#' "$out") options of systemd $version"
