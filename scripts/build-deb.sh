#!/usr/bin/env bash
# Builds the Debian package of provisioner: dist/provisioner_<version>_<arch>.deb
#   bash scripts/build-deb.sh
# From this checkout's files (tracked and untracked, not ignored): no build/ or *.egg-info is
# written into the tree. Needs Debian's python3.X (the target's interpreter: the package's
# private virtualenv links to it), python3-venv and dpkg-deb; PyPI (or PIP_FIND_LINKS with
# PIP_NO_INDEX=1, a wheelhouse) for the Python dependencies. Builds for this host's
# architecture (amd64 or arm64: the dependencies' wheels are per architecture).
#   PROVISIONER_DEB_PYTHON=/usr/bin/python3.11  the target's interpreter
#   PROVISIONER_DEB_VERSION=V                   the package version (default below)
#   PROVISIONER_SRC=DIR                         build another source tree (tests: a release)
#   PROVISIONER_DEB_OUT=DIR                     where the .deb goes (default <checkout>/dist)
# Layout and why: docs/operator-guide.md "The Debian package".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$(cd "${PROVISIONER_SRC:-$ROOT}" && pwd)
OUT=${PROVISIONER_DEB_OUT:-$ROOT/dist}
PY=${PROVISIONER_DEB_PYTHON:-/usr/bin/python3.11}
PREFIX=/usr/lib/provisioner
VENV=$PREFIX/venv
DEBIAN_DIR=$ROOT/packaging/debian

log() { printf 'build-deb: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -x $PY ]] || die "$PY not found: apt-get install python3 python3-venv (Debian's, the target's)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian host builds the package)"
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ARCH=$(dpkg --print-architecture)
BASE=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$SRC/pyproject.toml")
if [[ -n ${PROVISIONER_DEB_VERSION:-} ]]; then
  VERSION=$PROVISIONER_DEB_VERSION
elif git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
    && ! git -C "$SRC" describe --exact-match --tags --match "v$BASE" >/dev/null 2>&1; then
  # between releases: the commit's date orders successive builds for dpkg
  VERSION="$BASE+git$(git -C "$SRC" log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(git -C "$SRC" rev-parse --short=7 HEAD)"
else
  VERSION=$BASE
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/provisioner-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/root
mkdir -p "$WORK/src" "$WORK/wheel" "$STAGE"

# 1. the sources (no build outputs, caches or .git)
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$SRC" ls-files -z -co --exclude-standard \
    | tar -C "$SRC" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$WORK/src" -xf -
else
  tar -C "$SRC" --exclude=.git --exclude=build --exclude=dist --exclude='*.egg-info' \
    --exclude=__pycache__ -cf - . | tar -C "$WORK/src" -xf -
fi

# 2. the private virtualenv, built at its final path's name under the staging root
log "virtualenv $VENV ($PY, Python $PYVER)"
"$PY" -m venv "$STAGE$VENV" || die "$PY -m venv failed: apt-get install python3-venv"
VPY=$STAGE$VENV/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log "wheel of $SRC"
"$VPY" -m pip wheel -q --no-deps -w "$WORK/wheel" "$WORK/src"
log "pip install (dependencies: ${PIP_FIND_LINKS:-PyPI})"
WHEEL=$(echo "$WORK"/wheel/provisioner-*.whl)
"$VPY" -m pip install -q --no-compile "provisioner[postgres] @ file://$WHEEL"   # database_url too
# dpkg owns this tree: nothing pip-installs into it, and nothing imports setuptools at run time
"$VPY" -m pip uninstall -q -y setuptools pip
SITE=$STAGE$VENV/lib/python$PYVER/site-packages

# 3. relocate: scripts and pyvenv.cfg name the staging path; byte-code names the final one
grep -rlI --null "$STAGE" "$STAGE$VENV/bin" "$STAGE$VENV/pyvenv.cfg" \
  | xargs -0 -r sed -i "s|$STAGE||g"
rm -f "$SITE"/provisioner-*.dist-info/direct_url.json
sed -i '/^provisioner-[^/]*\.dist-info\/direct_url\.json,/d' "$SITE"/provisioner-*.dist-info/RECORD
find "$STAGE$VENV" -name __pycache__ -type d -prune -exec rm -rf {} +   # ensurepip's, staged paths
nice "$STAGE$VENV/bin/python" -m compileall -q -j0 -s "$STAGE" -p / "$STAGE$VENV/lib" >/dev/null \
  || log "warning: compileall could not compile some files (they are compiled on first use)"

# 4. the command, the shipped files, systemd's files, the default configuration
install -d "$STAGE/usr/bin" "$STAGE/usr/share/provisioner" "$STAGE/lib/systemd/system" \
  "$STAGE/usr/lib/sysusers.d" "$STAGE/usr/lib/tmpfiles.d" "$STAGE/etc/provisioner" \
  "$STAGE/usr/share/doc/provisioner"
ln -s "../lib/provisioner/venv/bin/provisioner" "$STAGE/usr/bin/provisioner"
for name in pxe playbooks inventory; do
  if [[ -d $SITE/provisioner/_shipped/$name ]]; then   # the wheel's package data
    ln -s "../../lib/provisioner/venv/lib/python$PYVER/site-packages/provisioner/_shipped/$name" \
      "$STAGE/usr/share/provisioner/$name"
  else   # a release from before the wheel carried them: where that code looked
    cp -a "$WORK/src/$name" "$STAGE/usr/share/provisioner/$name"
    mkdir -p "$STAGE$VENV/share"
    ln -sfn /usr/share/provisioner "$STAGE$VENV/share/provisioner"
  fi
done
install -m 0644 "$WORK/src/systemd/provisioner.service" "$STAGE/lib/systemd/system/"
# a release whose unit ran /usr/local/bin/provisioner (a hand install's link)
sed -i 's|^ExecStart=/usr/local/bin/provisioner |ExecStart=/usr/bin/provisioner |' \
  "$STAGE/lib/systemd/system/provisioner.service"
install -m 0644 "$WORK/src/systemd/provisioner.sysusers" "$STAGE/usr/lib/sysusers.d/provisioner.conf"
install -m 0644 "$WORK/src/systemd/provisioner.tmpfiles" "$STAGE/usr/lib/tmpfiles.d/provisioner.conf"
install -m 0640 "$WORK/src/examples/provisioner.toml" "$STAGE/etc/provisioner/provisioner.toml"
install -m 0644 "$DEBIAN_DIR/copyright" "$STAGE/usr/share/doc/provisioner/copyright"
# the man page setup.py generated from the CLI's parser (a release before it: none)
MANPAGE=$SITE/provisioner/_shipped/man/provisioner.1
if [[ -f $MANPAGE ]]; then
  install -d "$STAGE/usr/share/man/man1"
  gzip -9n < "$MANPAGE" > "$STAGE/usr/share/man/man1/provisioner.1.gz"
  chmod 0644 "$STAGE/usr/share/man/man1/provisioner.1.gz"
fi

# 5. control files
install -d "$STAGE/DEBIAN"
for script in postinst prerm postrm; do
  sed "s|@VERSION@|$VERSION|g" "$DEBIAN_DIR/$script" > "$STAGE/DEBIAN/$script"
  chmod 0755 "$STAGE/DEBIAN/$script"
done
install -m 0644 "$DEBIAN_DIR/conffiles" "$STAGE/DEBIAN/conffiles"
PYDEB=$(dpkg-query -W -f='${Version}' "python$PYVER" 2>/dev/null || true)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@PYVER@|$PYVER|g" \
    -e "s|@PYDEB@|${PYDEB%%-*}|" -e "s|@SIZE@|$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)|" \
    "$DEBIAN_DIR/control" > "$STAGE/DEBIAN/control"

mkdir -p "$OUT"
DEB=$OUT/provisioner_${VERSION}_${ARCH}.deb
log "dpkg-deb $DEB"
nice dpkg-deb --root-owner-group -Zgzip --build "$STAGE" "$DEB" >/dev/null
printf '%s\n' "$DEB"
