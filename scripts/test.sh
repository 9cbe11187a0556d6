#!/usr/bin/env bash
# The one command that sets up and runs the whole test suite. Arguments go to pytest.
# Stages, in order, stopping at the first failure: setup, ruff, mypy, import-linter, pytest.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

log() { printf 'test.sh: %s\n' "$*" >&2; }

stage() {
  local name=$1 rc=0
  shift
  log "== $name: $*"
  "$@" || rc=$?
  if ((rc != 0)); then
    local hint=""
    [[ $name == pytest && $rc == 5 ]] && hint=" (no tests were collected)"
    log "FAILED at stage '$name' (exit $rc$hint): $*"
    exit "$rc"
  fi
}

VENV=$(bash scripts/setup.sh | tail -1) || { log "FAILED at stage 'setup': scripts/setup.sh"; exit 1; }
[[ -x $VENV/bin/python ]] || { log "FAILED at stage 'setup': no python in '$VENV'"; exit 1; }
export VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH

stage ruff ruff check provisioner tests
stage mypy mypy
stage import-linter lint-imports
# `python -m` also puts the repo root on sys.path (tests import tests.peers.*).
# Exit code 5 (no tests collected) is a failure too.
stage pytest python -m pytest -q -ra "$@"
