#!/usr/bin/env python3
"""Runs one fabric acceptance test on a node for playbooks/acceptance.yml (standard library
only: it runs on the node with Ansible's python3).

    acceptance_tool.py run [--probe JSON] [--about JSON] DIR NAME DEADLINE_S RUN_ID -- TOOL ARG...
    acceptance_tool.py cleanup RUN_ID
    acceptance_tool.py collect DIR

``run``: TOOL in a session of its own, with PROVISIONER_ACCEPTANCE_RUN=RUN_ID in its
environment (``mpirun -x`` passes it to remote ranks); at DEADLINE_S its whole session is
sent SIGTERM, then SIGKILL 10 s later. Writes DIR/NAME.json: rc (127: the tool is missing),
stdout, stderr, timed_out, elapsed_s. ``--probe``: a command (a JSON list) run first; where
it exits non-zero TOOL is not run and the result says ``available: false`` with the probe's
output (``dcgmi mndiag --help``: does this DCGM have mndiag). ``--about``: a command whose
output is kept as ``version`` (``dcgmi --version``). ``cleanup``: SIGKILL every process
whose environment names RUN_ID (what a killed mpirun left on this node). ``collect``:
DIR/*.json as one JSON object on DIR/result.json.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

MARKER = "PROVISIONER_ACCEPTANCE_RUN"
KEEP = 4 * 1024 * 1024  # bytes of each stream kept from its end
KEEP_HEAD = 1024 * 1024  # and from its start: NCCL_DEBUG=INFO's set-up lines (NVLS) of a
                         # long run come first


PROBE_S = 60.0


def _quick(argv, deadline_s):
    """A short command's exit status and output (the probe, the version)."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=min(PROBE_S, deadline_s))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": -1, "stdout": "", "stderr": str(exc)[-2000:]}
    return {"rc": done.returncode, "stdout": done.stdout.decode("utf-8", "replace")[-4000:],
            "stderr": done.stderr.decode("utf-8", "replace")[-4000:]}


def run(out_dir, name, deadline_s, run_id, argv, probe=None, about=None):
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    result = {"rc": 127, "stdout": "", "stderr": "", "timed_out": False, "elapsed_s": 0.0,
              "deadline_s": deadline_s, "command": argv}
    missing = not argv or shutil.which(argv[0]) is None
    if not missing and about:
        result["version"] = " ".join(_quick(about, deadline_s)["stdout"].split())[:200]
    if not missing and probe:
        result["probe"] = _quick(probe, deadline_s)
        result["available"] = result["probe"]["rc"] == 0
    if missing:
        result["stderr"] = "%s: command not found" % (argv[0] if argv else "(none)")
    elif result.get("available") is False:
        result["rc"] = result["probe"]["rc"]
    else:
        env = dict(os.environ, **{MARKER: run_id})
        started = time.monotonic()
        out_path, err_path = (os.path.join(out_dir, name + ext) for ext in (".out", ".err"))
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
            try:
                result["rc"] = proc.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                result["timed_out"] = True
                _kill_session(proc)
                result["rc"] = proc.returncode
        result["elapsed_s"] = round(time.monotonic() - started, 3)
        result["stdout"], result["stderr"] = _tail(out_path), _tail(err_path)
    with open(os.path.join(out_dir, name + ".json"), "w") as handle:
        json.dump(result, handle)


def _kill_session(proc):
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path):
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size <= KEEP_HEAD + KEEP:
            handle.seek(0)
            return handle.read().decode("utf-8", "replace")
        handle.seek(0)
        head = handle.read(KEEP_HEAD)
        head = head[:head.rfind(b"\n") + 1]  # whole lines only: a cut row reads as a cut run
        handle.seek(size - KEEP)
        tail = handle.read()
        tail = tail[tail.find(b"\n") + 1:]
        left = size - len(head) - len(tail)
        return "%s# [acceptance_tool: %d bytes left out]\n%s" % (
            head.decode("utf-8", "replace"), left, tail.decode("utf-8", "replace"))


def cleanup(run_id):
    needle = ("%s=%s" % (MARKER, run_id)).encode() + b"\0"
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                if needle not in handle.read() + b"\0":
                    continue
            os.kill(int(entry), signal.SIGKILL)
            killed.append(int(entry))
        except (OSError, ValueError):
            continue
    print(json.dumps({"killed": killed}))


def collect(out_dir):
    results = {}
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".json") and name != "result.json":
            with open(os.path.join(out_dir, name)) as handle:
                results[name[:-5]] = json.load(handle)
    with open(os.path.join(out_dir, "result.json"), "w") as handle:
        json.dump(results, handle)


def main(argv):
    if argv[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        head, options = argv[1:cut], {}
        while head[:1] in (["--probe"], ["--about"]) and len(head) > 1:
            options[head[0][2:]] = json.loads(head[1])
            head = head[2:]
        out_dir, name, deadline, run_id = head
        run(out_dir, name, float(deadline), run_id, argv[cut + 1:], **options)
    elif argv[:1] == ["cleanup"] and len(argv) == 2:
        cleanup(argv[1])
    elif argv[:1] == ["collect"] and len(argv) == 2:
        collect(argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
