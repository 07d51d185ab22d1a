#!/usr/bin/env bash
# Packs HEAD plus the listed working-tree files into build/snap.tar.gz, so a device run can
# build exactly that state while other work is in progress in the tree:
#   bash scripts/snapshot.sh FILE...   (device: mkdir /tmp/s && tar xzf build/snap.tar.gz -C /tmp/s)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf /tmp/fi-snap && mkdir -p /tmp/fi-snap build
git archive HEAD | tar x -C /tmp/fi-snap
for f in "$@"; do mkdir -p "/tmp/fi-snap/$(dirname "$f")"; cp "$f" "/tmp/fi-snap/$f"; done
tar czf build/snap.tar.gz -C /tmp/fi-snap .
ls -la build/snap.tar.gz
