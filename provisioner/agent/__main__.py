"""The agent's main loop: report facts, then poll for commands until told to stop.

Configuration comes from the kernel command line the iPXE script wrote:
``provisioner.url=http://10.0.0.1:8080 provisioner.token=pvt_... provisioner.mac=aa:bb:..``.
The daemon may be down (restarting): every call is retried with back-off, forever.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provisioner.agent.collect import collect
from provisioner.agent.deploy import write_image
from provisioner.agent.sanitise import node_disks, sanitise
from provisioner.agent.storage import build_arrays

log = logging.getLogger("provisioner.agent")


def kernel_args(text: str) -> dict[str, str]:
    args = {}
    for word in text.split():
        key, _, value = word.partition("=")
        if key.startswith("provisioner."):
            args[key.removeprefix("provisioner.")] = value
    return args


class AgentClient:
    """Calls to the agent API with the node's token. A 401 (the daemon restarted and issued
    a fresh token, or this one expired) is not the end: the agent fetches its boot script
    again (``/boot/<mac>.ipxe``, served only to the address the daemon bound for this MAC)
    and goes on with the token in it; a 4xx that persists is final (raises)."""

    def __init__(self, url: str, token: str, mac: str = "", *,
                 max_refreshes: int = 10) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.mac = mac
        self._max_refreshes = max_refreshes

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Retry until the daemon answers; a 4xx with a reason is final (raises)."""
        return json.loads(self.fetch(method, path, body) or b"{}")

    def fetch(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        """``call`` without JSON decoding of the answer (the cloud-init seed)."""
        delay, refreshes = 1.0, 0
        while True:
            try:
                return self._call_once(method, path, body)
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:500]
                if exc.code == 401 and self.mac and refreshes < self._max_refreshes:
                    refreshes += 1
                    if self._refresh_token():
                        continue
                elif 400 <= exc.code < 500:
                    raise RuntimeError(f"{method} {path}: {exc.code}: {detail}") from None
                log.warning("%s %s: %s; retrying in %.0f s", method, path, exc.code, delay)
            except (OSError, ValueError) as exc:
                log.warning("%s %s: %s; retrying in %.0f s", method, path, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)

    def _refresh_token(self) -> bool:
        """The token of this node's boot script, if it is another one than ours."""
        request = urllib.request.Request(f"{self.url}/boot/{self.mac}.ipxe")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                script = response.read().decode(errors="replace")
        except (OSError, ValueError) as exc:
            log.warning("fetching a fresh token failed: %s", exc)
            return False
        token = kernel_args(script).get("token")
        if not token or token == self.token:
            return False
        log.info("the daemon issued a fresh token; going on with it")
        self.token = token
        return True

    def _call_once(self, method: str, path: str, body: dict[str, Any] | None) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = response.read()
            return answer if isinstance(answer, bytes) else b""


def run(
    args: dict[str, str],
    *,
    gather: Callable[[], dict[str, Any]] = lambda: collect(Path("/")),
    power: Callable[[str], None] | None = None,
    device_dir: Path = Path("/dev"),
) -> int:
    """Report facts, then obey commands: ``wait``, ``report`` (again), ``poweroff``, ``reboot``,
    and run jobs (``deploy``, ``sanitise``, ``storage``)."""
    client = AgentClient(args["url"], args["token"], args.get("mac", ""))
    _report(client, args, gather)
    # jobs done, by generation, with what they reported: a repeated job (the daemon restarted
    # meanwhile) is answered from here, never run again (no second write, no second erase)
    done: dict[str, dict[str, Any]] = {}
    while True:
        command = client.call("GET", "/agent/v1/command")
        name = command.get("command", "wait")
        if name == "wait":
            time.sleep(float(command.get("interval_s", 5)))
        elif name == "report":  # the daemon restarted while its step waited for facts
            _report(client, args, gather)
        elif name in ("deploy", "sanitise", "storage"):
            result = _job(client, command, done, device_dir)
            client.call("POST", "/agent/v1/result", result)
            if result["ok"] and command.get("reboot"):  # no BMC: boot the disk ourselves
                log.info("reboot to the written disk")
                (power or _power)("reboot")
                return 0
        elif name in ("poweroff", "reboot"):
            client.call("POST", "/agent/v1/result", {"command": name, "ok": True})
            log.info("%s", name)
            (power or _power)(name)
            return 0
        else:
            log.warning("unknown command %r; waiting", name)
            time.sleep(5)


def _job(client: AgentClient, command: dict[str, Any], done: dict[str, dict[str, Any]],
         device_dir: Path) -> dict[str, Any]:
    """Run a deploy, sanitise or storage job; the result names its generation."""
    generation = str(command.get("generation", ""))
    result: dict[str, Any] = {"command": command["command"], "generation": generation}
    if generation in done:
        log.info("%s %s already done: answering from memory", command["command"], generation)
        return result | {"ok": True} | done[generation] | {"note": "already done"}
    if command["command"] == "sanitise":
        return _sanitise(command, result, done, device_dir)
    if command["command"] == "storage":  # md arrays (provisioner.agent.storage)
        if device_dir == Path("/dev"):  # the ramdisk has no /run: mdadm keeps its map there
            Path("/run/mdadm").mkdir(parents=True, exist_ok=True)
        outcome = build_arrays(command.get("arrays") or [], device_dir=device_dir)
        done[generation] = outcome
        return result | outcome
    try:
        report = write_image(command, device_dir=device_dir, fetch_seed=lambda: client.fetch(
            "GET", f"/agent/v1/seed?generation={generation}"))
        log.info("wrote %d bytes to %s (sha256 verified)", report["bytes"], command["disk"])
        result |= report
    except (RuntimeError, OSError, ValueError, KeyError) as exc:  # DeployError included
        log.error("%s failed: %s", command["command"], exc)
        return result | {"ok": False, "error": str(exc)}
    done[generation] = {}
    return result | {"ok": True}


def _sanitise(command: dict[str, Any], result: dict[str, Any],
              done: dict[str, dict[str, Any]], device_dir: Path) -> dict[str, Any]:
    """Erase every disk but those the daemon already has results for (``skip``). A failed
    disk fails the job; the job is kept as done all the same, with its results: the disks it
    erased are not erased again when the daemon asks again (the retry of a failed step is a
    new generation)."""
    skip = set(command.get("skip", []))
    disks = [name for name in node_disks() if name not in skip]
    reports = sanitise(disks, allow_overwrite=command.get("allow_overwrite") is True,
                       device_dir=device_dir)
    failed = [f"{r['device']}: {r['error']}" for r in reports if r.get("error")]
    outcome: dict[str, Any] = {"disks": reports, "ok": not failed}
    if failed:
        outcome["error"] = "; ".join(failed)
    elif not reports and not skip:
        outcome |= {"ok": False, "error": "no disk found to erase"}
    done[result["generation"]] = outcome
    return result | outcome


def _report(client: AgentClient, args: dict[str, str],
            gather: Callable[[], dict[str, Any]]) -> None:
    reply = client.call("POST", "/agent/v1/facts", {"mac": args.get("mac", ""),
                                                    "facts": gather()})
    client.token = reply.get("token", client.token)  # a token for the adopting node
    log.info("facts accepted for node %s", reply.get("node_id"))


def _power(action: str) -> None:
    os.sync()
    subprocess.run([action, "-f"], check=False)


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="provisioner-agent: %(message)s")
    args = kernel_args(Path("/proc/cmdline").read_text())
    args.update(kernel_args(" ".join(sys.argv[1:])))
    if "url" not in args or "token" not in args:
        log.error("no provisioner.url/provisioner.token on the kernel command line")
        return 2
    try:
        return run(args)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
