#!/usr/bin/env bash
# Builds the Kubernetes test peers (PEERS.md §10) from Go modules and caches them:
#   kube-apiserver  k8s.io/kubernetes through a wrapper module that pins every staging module
#   etcd            go.etcd.io/etcd/server/v3 through a wrapper main (its go.mod has replaces)
#   kwok            sigs.k8s.io/kwok/cmd/kwok, plus its fast node/pod Stage manifests
# into ${XDG_CACHE_HOME:-$HOME/.cache}/provisioner/kube-<hash of the pins>/{bin,stages}.
# Rebuilt only when a pin (or RECIPE) changes. Prints the bin dir as the LAST line of stdout;
# everything else goes to stderr.
#   --check   build nothing: print the bin dir if it is complete, else exit 1
# Needs Go >= the newest `go` line of the pins (1.24 for these) and the Go module proxy.
set -euo pipefail

KUBERNETES_VERSION=v1.34.4   # kube-apiserver; staging modules at v0.34.4
ETCD_VERSION=v3.6.16         # >= 3.5.13: has RequestWatchProgress (WatchList works)
KWOK_VERSION=v0.7.0
RECIPE=2                     # bump when the build steps below change

exec 3>&1 1>&2    # fd 3 = the real stdout, reserved for the final line
log() { printf 'kube_build.sh: %s\n' "$*"; }
die() { log "error: $*"; exit 1; }

home=${HOME:-$(getent passwd "$EUID" | cut -d: -f6)}
key=$(printf '%s\n' "$KUBERNETES_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$RECIPE" \
  | sha256sum | cut -c1-12)
CACHE=${XDG_CACHE_HOME:-$home/.cache}/provisioner/kube-$key
BIN=$CACHE/bin
BINARIES=(kube-apiserver etcd kwok)

complete() {
  local b
  [[ -f $CACHE/.complete ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x $BIN/$b ]] || return 1; done
}

if [[ ${1:-} == --check ]]; then
  complete || exit 1
  printf '%s\n' "$BIN" >&3
  exit 0
fi

command -v go >/dev/null || die "go not found on PATH (need Go >= 1.24; Debian's 1.19 is too old)"
mkdir -p "$CACHE"
exec 9>"$CACHE.lock"
flock 9    # two concurrent runs must not build into the same directory
if complete; then
  printf '%s\n' "$BIN" >&3
  exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false" GOWORK=off
LDFLAGS="-s -w"
WORK=$CACHE/src
rm -rf "$WORK" "$BIN.tmp"
mkdir -p "$WORK/kas" "$WORK/etcd" "$BIN.tmp"
gorun() { nice -n 19 go "$@"; }    # shared 2-core hosts: builds must not starve the tests
SECONDS=0

log "kube-apiserver $KUBERNETES_VERSION"
staging=v0.${KUBERNETES_VERSION#v1.}
kdir=$(gorun mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -f $kdir/go.mod ]] || die "k8s.io/kubernetes@$KUBERNETES_VERSION: no go.mod in the module cache"
# Every `k8s.io/<m> => ./staging/src/k8s.io/<m>` of that tag's go.mod, pinned to v0.X.Y instead.
mapfile -t mods < <(sed -n 's|^\t\(k8s.io/[^ ]*\) => ./staging/src/.*$|\1|p' "$kdir/go.mod")
((${#mods[@]} > 10)) || die "found only ${#mods[@]} staging replaces in $kdir/go.mod"
{
  printf 'module example.local/kas\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' \
    "$KUBERNETES_VERSION"
  for m in "${mods[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
  printf ')\n'
} >"$WORK/kas/go.mod"
printf 'package tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$WORK/kas/tools.go"
# What hack/lib/version.sh stamps; without it /version says v0.0.0-master+$Format:%H$.
minor=${KUBERNETES_VERSION#v1.}
vpkg=k8s.io/component-base/version
kldflags="$LDFLAGS -X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1"
kldflags+=" -X $vpkg.gitMinor=${minor%%.*} -X $vpkg.gitTreeState=clean"
(cd "$WORK/kas" && gorun mod tidy \
  && gorun build -ldflags="$kldflags" -o "$BIN.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
log "kube-apiserver built after ${SECONDS}s"

log "etcd $ETCD_VERSION"
cat >"$WORK/etcd/go.mod" <<EOF
module example.local/etcd

go 1.24.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
cat >"$WORK/etcd/main.go" <<'EOF'
// etcd's server/go.mod has replace directives, so `go install` refuses it: wrap its main.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
(cd "$WORK/etcd" && gorun mod tidy && gorun build -ldflags="$LDFLAGS" -o "$BIN.tmp/etcd" .)
log "etcd built after ${SECONDS}s"

log "kwok $KWOK_VERSION"
GOBIN=$BIN.tmp gorun install -ldflags="$LDFLAGS" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
kwdir=$(gorun mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
rm -rf "$CACHE/stages"
mkdir -p "$CACHE/stages"
for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
  pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  cp "$kwdir/kustomize/stage/$f.yaml" "$CACHE/stages/"
done
chmod u+w "$CACHE/stages"/*
log "kwok built after ${SECONDS}s"

rm -rf "$BIN" "$WORK"
mv "$BIN.tmp" "$BIN"
touch "$CACHE/.complete"
for b in "${BINARIES[@]}"; do log "$(du -h "$BIN/$b" | cut -f1) $b"; done
log "built in ${SECONDS}s"
printf '%s\n' "$BIN" >&3
