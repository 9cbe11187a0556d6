#!/usr/bin/env bash
# Builds the provisioner inspection ramdisk: Debian's kernel, busybox, python3 with just the
# standard library modules the agent imports, and the agent itself.
#   bash pxe/ramdisk/build.sh [OUT_DIR]     -> OUT_DIR/vmlinuz, OUT_DIR/initrd.gz
# Cached: rebuilt only when the agent, this script or the Debian packages change.
# Needs Debian packages: linux-image-amd64 busybox-static python3 cpio kmod.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/provisioner/ramdisk}
PY=/usr/bin/python3
MODULES=(virtio_net virtio_pci virtio_blk e1000 e1000e igb ixgbe mlx5_core nvme ahci sd_mod)

KVER=$(ls /lib/modules | sort -V | tail -1)
KERNEL=/boot/vmlinuz-$KVER
[ -r "$KERNEL" ] || { echo "build.sh: no kernel at $KERNEL (install linux-image-amd64)" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "build.sh: no /bin/busybox (install busybox-static)" >&2; exit 1; }
[ -x "$PY" ] || { echo "build.sh: no $PY (install python3)" >&2; exit 1; }

key=$( (cat "$HERE/build.sh" "$HERE/init" "$HERE/udhcpc.script" "$ROOT"/provisioner/agent/*.py;
        echo "$KVER"; dpkg-query -W busybox-static python3.11 2>/dev/null) | sha256sum | cut -c1-16)
if [ -f "$OUT/initrd.gz" ] && [ "$(cat "$OUT/key" 2>/dev/null)" = "$key" ]; then
  echo "$OUT"; exit 0
fi

WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
R=$WORK/root
mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,root,usr/bin,opt/agent/provisioner/agent,lib/modules}
cp /bin/busybox "$R/bin/busybox"
install -m 0755 "$HERE/init" "$R/init"
install -m 0755 "$HERE/udhcpc.script" "$R/etc/udhcpc.script"

# Kernel modules in load order (dependencies first); built-in ones print nothing.
: > "$R/etc/modules.order"
for module in "${MODULES[@]}"; do
  modprobe --show-depends -S "$KVER" "$module" 2>/dev/null | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  mkdir -p "$R$(dirname "$ko")"
  cp "$ko" "$R$ko"
  echo "$ko" >> "$R/etc/modules.order"
done

# python3 and the shared libraries it needs.
cp "$PY" "$R/usr/bin/python3"
copy_lib() {  # copy_lib PATH: a shared library into the ramdisk, once
  if [ -n "$1" ] && [ ! -e "$R$1" ]; then mkdir -p "$R$(dirname "$1")"; cp -L "$1" "$R$1"; fi
}
ldd "$PY" | awk '/=>/ {print $3} /^\t\// {print $1}' | while read -r lib; do copy_lib "$lib"; done
# The standard library modules the agent imports (found by running the import, so dynamic
# imports count), as source: stdlib .py plus the C extension modules they load.
STDLIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
PYTHONPATH="$ROOT" "$PY" -S -c '
import sys
before = set(sys.modules)
import encodings.idna, encodings.ascii, encodings.latin_1, encodings.utf_8
import provisioner.agent.__main__, provisioner.agent.collect, provisioner.agent.facts
import provisioner.agent.deploy, zlib, hashlib, threading
import http.client, urllib.request, json, subprocess, logging, email.parser
import runpy, importlib.machinery, importlib.util, pkgutil
for name, mod in sorted(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if path and not name.startswith("provisioner"):
        print(path)
' | while read -r path; do
  case "$path" in "$STDLIB"/*|/usr/lib/python3/*) ;; *) continue ;; esac
  mkdir -p "$R$(dirname "$path")"
  cp "$path" "$R$path"
done
for lib in $(find "$R$STDLIB" -name '*.so' 2>/dev/null); do
  ldd "$lib" | awk '/=>/ {print $3}' | while read -r dep; do copy_lib "$dep"; done
done
cp "$ROOT"/provisioner/agent/*.py "$R/opt/agent/provisioner/agent/"
printf '"""provisioner (agent only)."""\n' > "$R/opt/agent/provisioner/__init__.py"

mkdir -p "$OUT"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -6 > "$OUT/initrd.gz.tmp"
cp "$KERNEL" "$OUT/vmlinuz.tmp"
mv "$OUT/initrd.gz.tmp" "$OUT/initrd.gz"; mv "$OUT/vmlinuz.tmp" "$OUT/vmlinuz"
echo "$key" > "$OUT/key"
echo "build.sh: $(du -h "$OUT/initrd.gz" | cut -f1) initrd, kernel $KVER" >&2
echo "$OUT"
