"""ansible-runner, the only module importing it (untyped: ``Any`` stays in here).

Each run gets its own private data dir (``workdir.py``) and runs ``ansible-playbook`` in the
injected "install" pool, never on the loop. Runner's ``event_handler`` fires on that thread: it
translates task events into ``InstallEvent`` and hands them to the loop with
``call_soon_threadsafe``. Iterate an ``AnsibleRun`` for its events; ``AnsibleRunner.run``
also passes the noteworthy ones to ``on_event`` (the node's history) as they happen.

Cancelling (abort, shutdown) sets a ``threading.Event`` that runner's ``cancel_callback``
reads every ``_POLL_S``; runner then kills ansible-playbook's process group, and the
cancelled coroutine waits for that (at most ``RunnerOptions.stop_wait_s``) before it
re-raises.

Runner kills a playbook that outlives ``timeout_s`` itself. A watchdog
(``provisioner.watchdog``) bounds the whole run on its "install" thread as well, at
``deadline_s`` (``install.run_timeout_s + install.run_grace_s``) after the thread picked it
up: for what runner cannot end (a child in uninterruptible sleep that ``isalive()`` forever,
a private data dir on a hung filesystem, a bug). On expiry every process of the run is
SIGKILLed (found by its unique inventory path, as below), the run fails
``CallDeadlineExceeded`` (retryable) and its events end; the thread, if it still does not
return, stays abandoned and holds its slot of the pool; once every slot is so held, new
runs fail ``PoolExhausted`` at once rather than queue forever.

Secrets (join token, agent token) never touch the private data dir, the command line or
the environment: each playbook declares them as ``vars_prompt`` with the prompt
``provisioner secret <name>``, and runner's ``passwords`` answers the prompt through the
pty. The environment runner records in ``artifacts/*/command`` is scrubbed of the daemon's
own variables (``PROVISIONER_*`` may hold a database password).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from provisioner.errors import ConfigError, FatalError, ProvisionerError
from provisioner.install.base import InstallEvent, OnEvent, RunResult, TaskStatus
from provisioner.install.events import ANSI, recap_from_stats, translate
from provisioner.install.workdir import RunDir, create_run_dir_blocking, finish_run_dir_blocking
from provisioner.watchdog import Watchdog

log = logging.getLogger(__name__)
_POLL_S = 0.25  # how often runner looks at the cancel flag and the timeout
_ENV_KEEP = re.compile(r"^(PATH|HOME|USER|LOGNAME|SHELL|TMPDIR|TZ|LANG|LANGUAGE|LC_\w+|"
                       r"SSH_AUTH_SOCK|ANSIBLE_\w+|(?i:https?_proxy|no_proxy))$")
_DONE = object()


def secret_prompt(name: str) -> str:
    """The ``vars_prompt`` prompt a playbook uses for secret ``name``."""
    return f"provisioner secret {name}"


def find_ansible_playbook() -> Path:
    """``ansible-playbook`` on PATH, else next to this interpreter (a venv's bin); a
    ConfigError at startup rather than every run failing with rc 127."""
    found = shutil.which("ansible-playbook")
    if found is not None:
        return Path(found)
    beside = Path(sys.executable).parent / "ansible-playbook"
    if os.access(beside, os.X_OK):
        return beside
    raise ConfigError("ansible-playbook not found on PATH nor in "
                      f"{beside.parent}: install ansible-core (pip install ansible-core)")


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One playbook run against one node. ``secrets``: name -> value, answered to the
    playbook's ``vars_prompt``; every secret a playbook prompts for must be given."""

    node_id: str
    run_id: str
    playbook: str
    inventory: Mapping[str, object]
    extravars: Mapping[str, object]
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    state_dir: Path  # private data dirs go under <state_dir>/ansible/
    playbooks: Path
    binary: Path
    timeout_s: float
    forks: int
    keep_failed_runs: int
    control_path_dir: Path | None = None  # ssh ControlMaster sockets; None: ~/.ansible/cp
    deadline_s: float | None = None  # the watchdog's; None: timeout_s + 120 s
    stop_wait_s: float = 30.0  # a cancelled run waits this long for runner to stop
    pool_slots: int = 1  # threads of the "install" pool the runs share

    @property
    def watchdog_deadline_s(self) -> float:
        return self.deadline_s if self.deadline_s is not None else self.timeout_s + 120.0


class AnsibleRun:
    """One running playbook: an async iterator of its ``InstallEvent``s (ending when the
    run ends), then ``result()``. ``stop()`` cancels it and waits until runner stopped."""

    def __init__(self, spec: RunSpec, options: RunnerOptions, watchdog: Watchdog) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._cancel = threading.Event()
        self._spec = spec
        self._options = options
        self._inventory: str | None = None  # set by the thread once the run dir exists
        self._future = asyncio.ensure_future(watchdog.call(
            self._run_blocking, what=f"ansible-runner {spec.playbook} for node {spec.node_id}",
            deadline_s=options.watchdog_deadline_s, on_expiry=self._expire))
        self._future.add_done_callback(self._ended)

    def __aiter__(self) -> AnsibleRun:
        return self

    async def __anext__(self) -> InstallEvent:
        item = await self._queue.get()
        if item is _DONE:
            self._queue.put_nowait(_DONE)  # iterating again ends at once
            raise StopAsyncIteration
        assert isinstance(item, InstallEvent)
        return item

    async def result(self) -> RunResult:
        return await self._future

    async def stop(self) -> None:
        """Cancel the run; return once ansible-playbook is gone (even if cancelled again),
        or after ``stop_wait_s`` with its processes killed and its thread abandoned."""
        self._cancel.set()
        done, _ = await asyncio.wait({self._future}, timeout=self._options.stop_wait_s)
        if not done:
            log.error("node %s: ansible-runner did not stop within %g s of its cancel; "
                      "killing its processes", self._spec.node_id, self._options.stop_wait_s)
            self._expire()

    def _ended(self, future: asyncio.Future[RunResult]) -> None:
        """The run ended (even by the watchdog, its thread still stuck): events end too."""
        if not future.cancelled():
            future.exception()  # retrieved: result() re-raises it for whoever awaits
        self._queue.put_nowait(_DONE)

    def _expire(self) -> None:
        """The watchdog's deadline passed: cancel, and kill whatever the run started (off
        the loop: it reads /proc)."""
        self._cancel.set()
        marker = self._inventory
        if marker is not None:
            threading.Thread(target=kill_leftovers_blocking, args=(marker,), daemon=True,
                             name="ansible-kill").start()

    # -- the "install" thread -----------------------------------------------------------------

    def _post(self, item: object) -> None:
        # RuntimeError: the loop is closed (the daemon is gone; nobody listens any more)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _run_blocking(self) -> RunResult:
        spec, options = self._spec, self._options
        try:
            if self._cancel.is_set():
                return RunResult(status="canceled", rc=-1)
            run_dir = create_run_dir_blocking(
                options.state_dir / "ansible", spec.node_id, spec.run_id, options.playbooks,
                inventory=spec.inventory, extravars=spec.extravars)
            self._inventory = str(run_dir.inventory)
            result = self._execute_blocking(run_dir)
            finish_run_dir_blocking(run_dir, ok=result.ok,
                                    keep_failed=options.keep_failed_runs)
            return result
        finally:
            self._post(_DONE)

    def _execute_blocking(self, run_dir: RunDir) -> RunResult:
        spec = self._spec
        failures: list[InstallEvent] = []

        def on_event(raw: dict[str, Any]) -> bool:
            for event in translate(raw):
                if event.status in (TaskStatus.FAILED, TaskStatus.UNREACHABLE):
                    failures.append(event)
                self._post(event)
            return True  # keep runner's job_events/ (a failed run's dir is kept)

        try:
            runner = ansible_runner.Runner(
                self._config_blocking(run_dir), event_handler=on_event,
                cancel_callback=self._cancel.is_set)
            status, rc = runner.run()
            stats: Any = runner.stats
        except ansible_runner.AnsibleRunnerException as exc:
            raise FatalError(f"ansible-runner failed for {spec.playbook}: {exc}") from None
        finally:
            if killed := kill_leftovers_blocking(str(run_dir.inventory)):
                log.info("node %s: killed %d leftover ansible processes", spec.node_id,
                         len(killed))
        return RunResult(status=str(status), rc=int(rc if rc is not None else -1),
                         recap=recap_from_stats(stats), failures=tuple(failures),
                         private_data_dir=str(run_dir.path),
                         stdout_tail=_stdout_tail(run_dir.path / "artifacts" / "run"))

    def _config_blocking(self, run_dir: RunDir) -> Any:
        spec, options = self._spec, self._options
        passwords = {rf"{re.escape(secret_prompt(name))}:\s*$": value
                     for name, value in spec.secrets.items()}
        config = ansible_runner.RunnerConfig(
            private_data_dir=str(run_dir.path), playbook=spec.playbook,
            inventory=str(run_dir.inventory), ident="run", quiet=True,
            passwords=passwords, forks=options.forks,
            timeout=max(1, int(options.timeout_s)),
            settings={"pexpect_timeout": _POLL_S, "suppress_ansible_output": True},
            envvars=self._envvars_blocking())
        config.prepare()
        config.env = scrub_env(config.env, os.environ)
        return config

    def _envvars_blocking(self) -> dict[str, str]:
        options = self._options
        env = {"PATH": str(options.binary.parent) + os.pathsep + os.environ.get("PATH", ""),
               "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_NOCOLOR": "True",
               # ansible-runner's default is False, which puts StrictHostKeyChecking=no
               # ahead of the node's pinned keys (install/known_hosts.py)
               "ANSIBLE_HOST_KEY_CHECKING": "True"}
        if options.control_path_dir is not None:
            env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(options.control_path_dir)
        return env


def kill_leftovers_blocking(marker: str) -> list[int]:
    """Kill what is left of a cancelled or timed-out run: processes whose command line
    names this run's inventory (unique per run), with their process groups. Runner kills
    ansible-playbook's process group only, but ansible-core's workers ``setsid()`` and
    would otherwise finish their task (and its ssh) as orphans."""
    needle, killed = marker.encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "cmdline").read_bytes():
                continue
            pid = int(entry.name)
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)  # the worker and the ssh it started
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return killed


def scrub_env(env: Mapping[str, str], parent: Mapping[str, str]) -> dict[str, str]:
    """Drop what the daemon's own environment passed through (it may hold secrets such as
    ``PROVISIONER_DATABASE_URL``), except an allow-list that ssh and Ansible need; keep
    everything runner or we set."""
    return {key: value for key, value in env.items()
            if key not in parent or parent[key] != value or _ENV_KEEP.match(key)}


def _stdout_tail(artifact_dir: Path, lines: int = 15) -> str:
    try:
        text = (artifact_dir / "stdout").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [line for line in ANSI.sub("", text).splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


class AnsibleRunner:
    """Starts playbook runs in the "install" pool; ``on_event`` gets noteworthy events."""

    def __init__(self, options: RunnerOptions, pool: Executor,
                 on_event: OnEvent | None = None) -> None:
        self._options = options
        self._pool = pool
        self._watchdog = Watchdog(pool, name="install", slots=options.pool_slots)
        self._on_event = on_event

    @property
    def options(self) -> RunnerOptions:
        return self._options

    @property
    def pool(self) -> Executor:
        return self._pool

    @property
    def hung_runs(self) -> int:
        """Threads of the "install" pool held by runs past their deadline."""
        return self._watchdog.hung

    def set_event_sink(self, on_event: OnEvent | None) -> None:
        """Late wiring: the daemon builds the conductor after the installer."""
        self._on_event = on_event

    def start(self, spec: RunSpec) -> AnsibleRun:
        log.info("node %s: ansible %s started (run %s)", spec.node_id, spec.playbook,
                 spec.run_id)
        return AnsibleRun(spec, self._options, self._watchdog)

    async def run(self, spec: RunSpec) -> RunResult:
        """Run to the end, handing noteworthy events to ``on_event`` as they come. A
        cancelled caller cancels the run and waits for runner to stop first."""
        run = self.start(spec)
        try:
            async for event in run:
                if event.noteworthy:
                    await self._notify(spec.node_id, event)
            result = await run.result()
        except BaseException:
            await run.stop()
            raise
        log.info("node %s: ansible %s %s (rc %d, changed %d)", spec.node_id, spec.playbook,
                 result.status, result.rc, result.changed)
        return result

    async def _notify(self, node_id: str, event: InstallEvent) -> None:
        if self._on_event is None:
            return
        try:
            await self._on_event(node_id, event)
        except ProvisionerError as exc:  # history is best effort: never fail the run for it
            log.warning("node %s: ansible event not recorded: %s", node_id, exc)
