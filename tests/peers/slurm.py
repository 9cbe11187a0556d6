"""A real Slurm controller on loopback (PEERS.md §7), with its own munged.

Verified recipe (Slurm 22.05.8, munge 0.5.15, Debian 12):
- munged runs as user ``munge`` with ``--socket`` in a directory made by ``mkdtemp`` in /tmp
  (pytest's ``tmp_path`` is under a 0700 root directory munge cannot enter), chowned to
  munge and mode 0755: with 0700 munged fails "Socket is inaccessible: execute permissions
  for all required". Slurm finds the socket through ``AuthInfo=socket=<path>``.
- ``SlurmUser=root`` keeps slurmctld from dropping to ``slurm``, so its config, state and log
  may live in ``tmp_path``.
- Ports come from the OS (``SlurmctldPort``), so a second cluster on the host does not clash.
- No ``MaxNodeCount``: its reserved (future) node records count for topology/tree as nodes no
  switch reaches ("switches lack access to 4080 nodes", "no switch can reach all nodes").
- Ready: ``scontrol ping`` says "is UP" (it names the host by its real name, not
  ``SlurmctldHost=localhost``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.peers.ports import free_tcp_port

MUNGED = "/usr/sbin/munged"
MUNGE_KEY = Path("/etc/munge/munge.key")


def slurm_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "slurmctld and munged need root here (CI runs as root)"
    missing = [t for t in ("slurmctld", "scontrol", "munge") if shutil.which(t) is None]
    if missing or not Path(MUNGED).exists() or not MUNGE_KEY.exists():
        return f"Slurm/munge not installed ({', '.join(missing) or MUNGED}): run scripts/setup.sh"
    return None


@dataclass
class Slurm:
    conf: Path
    log: Path

    def scontrol(self, *args: str) -> str:
        result = subprocess.run(["scontrol", *args], env=self.env(), capture_output=True,
                                text=True, timeout=30, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))


@contextmanager
def running_munged() -> Iterator[Path]:
    """munged on a private socket; yields the socket path."""
    directory = Path(tempfile.mkdtemp(prefix="munge-", dir="/tmp"))
    try:
        shutil.copy(MUNGE_KEY, directory / "key")
        for path in (directory, directory / "key"):
            shutil.chown(path, "munge", "munge")
        directory.chmod(0o755)
        (directory / "key").chmod(0o600)
        sock = directory / "sock"
        proc = subprocess.Popen(
            [MUNGED, "-F", f"--socket={sock}", f"--key-file={directory / 'key'}",
             f"--pid-file={directory / 'pid'}", f"--log-file={directory / 'log'}",
             f"--seed-file={directory / 'seed'}"], user="munge", group="munge",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait(lambda: sock.exists(), proc, 10, "munged did not create its socket")
            yield sock
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def running_slurmctld(workdir: Path, node_lines: Sequence[str], topology_conf: str | None,
                      munge_socket: Path, plugin: str = "topology/tree",
                      extra: Mapping[str, str] | None = None) -> Iterator[Slurm]:
    """slurmctld -D in the foreground with ``node_lines`` (``NodeName=...``) and, when given,
    ``topology.conf`` next to slurm.conf; ``extra`` adds or overrides slurm.conf keys."""
    (workdir / "state").mkdir(parents=True, exist_ok=True)
    conf = workdir / "slurm.conf"
    settings = {
        "ClusterName": "provtopo", "SlurmctldHost": "localhost", "SlurmUser": "root",
        "AuthType": "auth/munge", "CredType": "cred/munge",
        "AuthInfo": f"socket={munge_socket}", "SlurmctldPort": str(free_tcp_port()),
        "SlurmdPort": str(free_tcp_port()), "StateSaveLocation": str(workdir / "state"),
        "SlurmdSpoolDir": str(workdir / "spool"), "SlurmctldPidFile": str(workdir / "ctld.pid"),
        "SlurmctldLogFile": str(workdir / "slurmctld.log"), "SlurmctldDebug": "debug",
        "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none", "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core", "TopologyPlugin": plugin,
        "ReturnToService": "2",
    }
    settings.update(extra or {})
    lines = [f"{k}={v}" for k, v in settings.items()] + list(node_lines)
    lines.append("PartitionName=all Nodes=ALL Default=YES State=UP")
    conf.write_text("\n".join(lines) + "\n")
    if topology_conf is not None:
        (workdir / "topology.conf").write_text(topology_conf)
    slurm = Slurm(conf, workdir / "slurmctld.log")
    out = open(workdir / "slurmctld.out", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["slurmctld", "-D", "-i"], env=slurm.env(), stdout=out,
                            stderr=subprocess.STDOUT)
    try:
        _wait(lambda: _up(slurm), proc, 30,
              lambda: (workdir / "slurmctld.out").read_text(errors="replace")[-2000:])
        yield slurm
    finally:
        _stop(proc)
        out.close()


def _up(slurm: Slurm) -> bool:
    try:
        return "is UP" in slurm.scontrol("ping")
    except RuntimeError:
        return False


def _wait(ready: object, proc: subprocess.Popen[bytes], timeout_s: float,
          reason: object) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            detail = reason() if callable(reason) else reason
            raise RuntimeError(f"peer not ready (exit {proc.poll()}): {detail}")
        time.sleep(0.2)



def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# --- dynamic slurmd and slurmrestd with JWT (PEERS.md §7) ----------------------------------
# slurmrestd refuses to run as root, so it runs as ``nobody``: the directory holding
# slurm.conf must be world-readable (pytest's tmp_path is not), hence ``open_workdir``.

JWT_SETTINGS = ("AuthAltTypes", "AuthAltParameters")


@contextmanager
def open_workdir(prefix: str = "slurm-") -> Iterator[Path]:
    """A 0755 directory under /tmp (slurm.conf there is readable by ``nobody``)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def jwt_extra(workdir: Path) -> dict[str, str]:
    """slurm.conf keys for ``auth/jwt`` beside munge, with a fresh HS256 key (mode 0600)."""
    key = workdir / "jwt_hs256.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    return {"AuthAltTypes": "auth/jwt", "AuthAltParameters": f"jwt_key={key}",
            "SlurmdSpoolDir": str(workdir / "spool" / "%n"),
            "SlurmdPidFile": str(workdir / "slurmd-%n.pid"),
            "SlurmdLogFile": str(workdir / "slurmd-%n.log"), "MaxNodeCount": "16"}


def slurm_token(slurm: Slurm, user: str = "root", lifespan_s: int = 3600) -> str:
    out = slurm.scontrol("token", f"username={user}", f"lifespan={lifespan_s}").strip()
    return out.partition("SLURM_JWT=")[2]


@contextmanager
def dynamic_cluster(prefix: str, extra: dict[str, str] | None = None
                    ) -> Iterator[tuple[Slurm, Path]]:
    """munged + a slurmctld with no static node (dynamic ``slurmd -Z`` workers register),
    auth/jwt, ``topology/none``; ``extra`` adds slurm.conf keys."""
    with open_workdir(prefix) as workdir, running_munged() as sock, \
            running_slurmctld(workdir, [], None, sock, plugin="topology/none",
                              extra=jwt_extra(workdir) | (extra or {})) as slurm:
        yield slurm, workdir


@contextmanager
def running_slurmd(slurm: Slurm, workdir: Path, name: str,
                   conf: str = "CPUs=2 RealMemory=2000 Feature=h100,ib") -> Iterator[
                       subprocess.Popen[bytes]]:
    """A dynamic ``slurmd -D -Z`` (one per host: it binds SlurmdPort); deleted after."""
    (workdir / "spool" / name).mkdir(parents=True, exist_ok=True)
    out = open(workdir / f"slurmd-{name}.out", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(["slurmd", "-D", "-Z", "-N", name, "--conf", conf],
                            env=slurm.env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            _stop(proc)
        out.close()
        with suppress(RuntimeError):  # deleted by the test, or never registered
            slurm.scontrol("delete", f"nodename={name}")


@contextmanager
def running_slurmrestd(slurm: Slurm, workdir: Path,
                       plugins: str = "openapi/v0.0.38,openapi/v0.0.37") -> Iterator[str]:
    """slurmrestd as ``nobody`` on a free loopback port, JWT auth; yields its base URL."""
    port = free_tcp_port()
    slurm.conf.chmod(0o644)
    out = open(workdir / "slurmrestd.out", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["slurmrestd", "-a", "rest_auth/jwt", "-s", plugins, f"127.0.0.1:{port}"],
        env=dict(slurm.env(), SLURM_JWT="daemon"), user="nobody", group="nogroup",
        stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _listening(port), proc, 20,
              lambda: (workdir / "slurmrestd.out").read_text(errors="replace")[-2000:])
        yield url
    finally:
        _stop(proc)
        out.close()


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def static_cluster(prefix: str, names: Sequence[str]) -> Iterator[tuple[Slurm, Path]]:
    """munged, slurmctld and one ``slurmd -D -N NAME`` per name, all on this host: each node
    is a static ``NodeName`` with a ``Port`` of its own (a dynamic ``slurmd -Z`` cannot take
    one, so only one of those fits a host). Jobs run on them (``sbatch -w NAME``)."""
    with open_workdir(prefix) as workdir, running_munged() as sock:
        lines = [f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 "
                 f"Port={free_tcp_port()} CPUs=2 RealMemory=2000" for n in names]
        extra = {"SlurmdSpoolDir": str(workdir / "spool" / "%n"),
                 "SlurmdPidFile": str(workdir / "slurmd-%n.pid"),
                 "SlurmdLogFile": str(workdir / "slurmd-%n.log")}
        with running_slurmctld(workdir, lines, None, sock, plugin="topology/none",
                               extra=extra) as slurm:
            procs = []
            try:
                for name in names:
                    (workdir / "spool" / name).mkdir(parents=True, exist_ok=True)
                    procs.append(subprocess.Popen(
                        ["slurmd", "-D", "-N", name], env=slurm.env(),
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                _wait(lambda: slurm.scontrol("show", "node", "-o").count("State=IDLE")
                      == len(names), procs[0], 30, lambda: slurm.scontrol("show", "node"))
                yield slurm, workdir
            finally:
                for proc in procs:
                    _stop(proc)
