#!/usr/bin/env bash
# Builds the inspection ramdisk of one architecture (default x86_64; ARCH=arm64 for Grace):
#   bash pxe/ramdisk/build.sh [OUT_DIR]     -> OUT_DIR/vmlinuz, OUT_DIR/initrd.gz
# A wrapper of the daemon's own builder (provisioner/ramdisk/; operators run
# `provisioner ramdisk build --arch x86_64|arm64`, and `provisioner serve` builds missing ones by
# itself). Cached: rebuilt only when the agent, the init scripts or the Debian packages change.
# Needs only Debian's python3 (no virtualenv): the builder is standard library only.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ARCH=${ARCH:-x86_64}
OUT=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/provisioner/ramdisk${ARCH/#x86_64/}}
PYTHONPATH="$ROOT" /usr/bin/python3 -m provisioner.ramdisk --arch "$ARCH" \
  --kernel "$OUT/vmlinuz" --initrd "$OUT/initrd.gz" --cache-dir "$OUT/cache" >&2
echo "$OUT"
