#!/usr/bin/env bash
# Does the README's test command work on a FRESH Debian 12 machine? A green CI on a machine
# where someone once installed things by hand proves little, so this:
#   1. bootstraps a clean Debian 12 root (debootstrap --variant=minbase bookworm);
#   2. bind-mounts this checkout at /repo inside it, with /proc, /sys, /dev and a private /run;
#   3. runs scripts/setup.sh there as root (every Debian package, the virtualenv, ...);
#   4. builds the Debian package there (scripts/build-deb.sh, into the root's /tmp) and checks
#      it with dpkg-deb;
#   5. runs a short list of tests there: qemu boot tests (x86 and arm64) and real-peer tests.
# Usage (root):  bash scripts/fresh-check.sh [PYTEST_ARGS...]
#   FRESH_DIR=DIR    where the root goes (default /var/tmp/provisioner-fresh); removed first
#   FRESH_KEEP=1     keep the root afterwards (to look around: chroot DIR/root)
#   FRESH_MIRROR=URL the Debian mirror (default http://deb.debian.org/debian)
# Not part of CI (it takes ~10 min and a few GB); run it before resolving an issue that adds
# a peer, and give its summary line in the closing note.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${FRESH_DIR:-/var/tmp/provisioner-fresh}
CHROOT=$DIR/root
MIRROR=${FRESH_MIRROR:-http://deb.debian.org/debian}
DEFAULT_TESTS=(
  tests/e2e/test_pxe_qemu.py                      # qemu x86: SeaBIOS iPXE, OVMF PXE, OVMF HTTP boot
  tests/e2e/test_arm64_boot_qemu.py               # qemu-system-aarch64 + AAVMF: PXE and HTTP boot
  tests/integration/test_router_advertisement.py  # rdisc6 (ndisc6) against our RA answers
  tests/integration/test_tftp.py                  # tftp-hpa and atftp clients
  tests/integration/test_dhcp_clients.py          # dhclient and udhcpc in namespaces
  tests/integration/test_postgres_peer.py         # a real PostgreSQL 15
  tests/e2e/test_wheel_install.py                 # the wheel in a clean venv serves the demo
  tests/e2e/test_first_rack_walkthrough.py       # docs/first-rack.md, run from the wheel
)

log() { printf 'fresh-check: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

((EUID == 0)) || die "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"

MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[i]}" 2>/dev/null || true; done
  if [[ ${FRESH_KEEP:-0} != 1 ]]; then rm -rf "$DIR"; fi
}
trap cleanup EXIT

bind() {  # bind SOURCE TARGET [mount options...]
  local src=$1 dst=$2
  shift 2
  mkdir -p "$dst"
  mount "$@" "$src" "$dst"
  MOUNTS+=("$dst")
}

started=$(date +%s)
rm -rf "$DIR"
mkdir -p "$DIR"
log "debootstrap bookworm into $CHROOT ($MIRROR)"
debootstrap --variant=minbase --include=ca-certificates bookworm "$CHROOT" "$MIRROR" \
  >"$DIR/debootstrap.log" 2>&1 \
  || { tail -20 "$DIR/debootstrap.log" >&2; die "debootstrap failed"; }
# Like the project's machines: installing a package never starts its service.
printf '#!/bin/sh\nexit 101\n' >"$CHROOT/usr/sbin/policy-rc.d"
chmod 0755 "$CHROOT/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
# What the machine image (not the project) provides: the site's own CAs (a TLS-inspecting
# egress proxy, a local mirror) and pip's configuration. Nothing else of the host comes along.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$CHROOT/usr/local/share/ca-certificates/"
  chroot "$CHROOT" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed"
fi
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$CHROOT/etc/pip.conf"

# The root must be a mount point of its own: `ip -n NS ...` remounts / as a slave mount in
# its private mount namespace, which fails (EINVAL) on a plain directory.
bind "$CHROOT" "$CHROOT" --bind
bind proc "$CHROOT/proc" -t proc
bind sysfs "$CHROOT/sys" -t sysfs
bind /dev "$CHROOT/dev" --rbind
bind tmpfs "$CHROOT/run" -t tmpfs
bind tmpfs "$CHROOT/tmp" -t tmpfs
bind "$ROOT" "$CHROOT/repo" --bind

tests=("$@")
((${#tests[@]})) || tests=("${DEFAULT_TESTS[@]}")
log "setup.sh + pytest ${tests[*]} inside the fresh root"
rc=0
chroot "$CHROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  CI=true bash -c 'cd /repo && VENV=$(bash scripts/setup.sh | tail -1) &&
    deb=$(PROVISIONER_DEB_OUT=/tmp/dist bash scripts/build-deb.sh) &&
    dpkg-deb --info "$deb" >/dev/null && dpkg-deb --contents "$deb" \
      | grep " ./lib/systemd/system/provisioner.service$" >/dev/null &&
    echo "fresh-check: built $(basename "$deb")" >&2 &&
    "$VENV/bin/python" -m pytest -q -ra -p no:cacheprovider "$@"' fresh-check "${tests[@]}" \
  || rc=$?
log "finished in $(($(date +%s) - started)) s with exit code $rc"
exit "$rc"
