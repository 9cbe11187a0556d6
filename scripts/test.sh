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
# pyghmi keeps its IPMI sessions in process-global state, so its tests run in their own
# processes: a BMC test cannot inherit sessions (or dead BMCs) from another.
PYGHMI_TESTS=(tests/integration/test_bmc_ipmi.py tests/integration/test_bmc_faults.py)
if (($# == 0)); then
  deselect=()
  for t in "${PYGHMI_TESTS[@]}"; do deselect+=(--ignore="$t"); done
  for t in "${PYGHMI_TESTS[@]}"; do stage "pytest $t" python -m pytest -q -ra "$t"; done
  stage pytest python -m pytest -q -ra "${deselect[@]}"  # last: its summary closes the run
else
  stage pytest python -m pytest -q -ra "$@"
fi
