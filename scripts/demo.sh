#!/usr/bin/env bash
# Set up, then run the daemon's main job on the embedded default: SQLite and a simulated rack
# of 16 GPU nodes on the fake drivers. Shows `provisioner node list` while the nodes move
# enrolled -> inspecting -> ... -> active, then stops the daemon.
#   bash scripts/demo.sh            (PROVISIONER_DEMO_NODES=N for another rack size)
#   bash scripts/demo.sh --keep     leaves the daemon running; prints the web console's URL
#                                   and a sign-in token
set -euo pipefail
KEEP=0
case "${1:-}" in
  --keep) KEEP=1 ;;
  "") ;;
  *) echo "usage: bash scripts/demo.sh [--keep]" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/provisioner"
DEMO="$CACHE/demo"
if [ -f "$DEMO/daemon.pid" ] && kill -0 "$(cat "$DEMO/daemon.pid")" 2>/dev/null; then
  kill -TERM "$(cat "$DEMO/daemon.pid")"   # the daemon an earlier --keep left running
  sleep 1
fi
rm -rf "$DEMO"; mkdir -p "$DEMO"
# the runtime only (python3, python3-venv, a venv without the test extras): no test peer;
# setup.sh's progress only when it fails
VENV=$(bash "$ROOT/scripts/setup.sh" --runtime 2>"$DEMO/setup.log" | tail -1) \
  || { cat "$DEMO/setup.log" >&2; exit 1; }
PV="$VENV/bin/provisioner"
PORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
NODES=${PROVISIONER_DEMO_NODES:-16}
sed -e "s|^state_dir = .*|state_dir = \"$DEMO/state\"|" \
    -e "s|^listen = .*|listen = \"127.0.0.1:$PORT\"|" \
    -e "s|^nodes = .*|nodes = $NODES|" "$ROOT/examples/demo.toml" > "$DEMO/provisioner.toml"
CFG=(--config "$DEMO/provisioner.toml")

"$PV" "${CFG[@]}" db upgrade >>"$DEMO/setup.log" 2>&1 || { cat "$DEMO/setup.log" >&2; exit 1; }
export PROVISIONER_TOKEN
PROVISIONER_TOKEN=$("$PV" "${CFG[@]}" token create --role admin --name demo 2>/dev/null | tail -1)
"$PV" "${CFG[@]}" serve 2>"$DEMO/daemon.log" &
DAEMON=$!
echo "$DAEMON" > "$DEMO/daemon.pid"
trap 'kill -TERM $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 100); do   # no curl on a fresh Debian: the venv's python asks
  "$VENV/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
    "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
echo "provisioner is serving on http://127.0.0.1:$PORT (log: $DEMO/daemon.log)"
count_active() {
  "$PV" "${CFG[@]}" node list --state active --json --all \
    | "$VENV/bin/python" -c 'import json, sys; print(len(json.load(sys.stdin)))'
}
active=0
for _ in $(seq 180); do
  [ -t 1 ] && clear
  date +%T
  "$PV" "${CFG[@]}" node list --all
  active=$(count_active)
  [ "$active" -ge "$NODES" ] && break
  sleep 1
done
echo
echo "$active of $NODES nodes are active. The history of sim-r01-n001:"
"$PV" "${CFG[@]}" node history sim-r01-n001
echo
if [ "$KEEP" = 1 ]; then
  trap - EXIT
  echo "The daemon keeps running (pid $DAEMON, log $DEMO/daemon.log)."
  echo "Web console: http://127.0.0.1:$PORT/ui/"
  echo "Sign-in token (role admin): $PROVISIONER_TOKEN"
  echo "Stop it: kill $DAEMON"
  exit 0
fi
echo "Stopping the daemon. Its state stays in $DEMO/state; to run it again:"
echo "  $PV ${CFG[*]} serve"
