"""A Debian node to run Ansible against over real SSH: the debootstrap root (cached, see
``debootstrap.py``) under a throw-away overlay, with the root's own ``sshd`` running
chrooted into it, inside a network namespace the test creates.

Layout (PEERS.md §1, §9):
- ``ip netns add``; ``lo`` and a veth NIC ``eth0`` (fixed MAC, 10.77.0.2/24; its peer
  ``wire0`` stays in the namespace too) exist only in the namespace. Nothing is addressed
  in the root namespace.
- ``ip netns exec NS unshare --mount --uts --pid --fork --kill-child``: a private mount
  namespace (overlay, proc, the netns's sysfs, /dev, tmpfs /run and /tmp), a private UTS
  namespace (the playbooks may set the hostname) and a PID namespace whose init is sshd
  (SIGKILL to the unshare PID kills everything the sessions started).
- Ansible stays in the root namespace (as the daemon's runner does) and reaches the node
  through ``ProxyCommand=ip netns exec NS socat STDIO TCP:%h:%p``: ``ansible_host`` is the
  node's address inside the namespace. ControlMaster sockets live in a per-test dir.

It is SSH into a chroot, not Ansible's chroot connection: modules run through the target's
sshd and python3, like on a real node. What shares the host's kernel (kernel modules,
sysctl, swap, running services) is left out with ``provisioner_runtime: false``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.peers.debootstrap import ensure_debian_root, unmount_under

NODE_ADDRESS: Final = "10.77.0.2"
NODE_MAC: Final = "52:54:00:77:00:02"
READY_TIMEOUT_S: Final = 20.0
_SSHD_CONFIG: Final = """\
Port 22
ListenAddress {address}
HostKey /etc/ssh/provisioner-test/host_ed25519
PidFile /run/sshd-test.pid
AuthorizedKeysFile /etc/ssh/provisioner-test/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp /usr/lib/openssh/sftp-server
"""


@dataclass(frozen=True, slots=True)
class SshNode:
    namespace: str
    address: str
    mac: str
    key: Path  # the client's private key (root's authorized key on the node)
    upper: Path  # the overlay's upper dir: every file the playbooks wrote or changed
    pid: int  # the unshare process (its child, sshd, is PID 1 of the node)

    def ssh_common_args(self, connect_timeout_s: int = 5) -> str:
        proxy = f"ip netns exec {self.namespace} socat STDIO TCP:%h:%p"
        return (f"-o ProxyCommand={shlex.quote(proxy)} -o StrictHostKeyChecking=no "
                f"-o UserKnownHostsFile=/dev/null -o ConnectTimeout={connect_timeout_s} "
                "-o LogLevel=ERROR")

    def changed_file(self, path: str) -> Path:
        """Where a file the playbooks wrote lies in the overlay's upper dir."""
        return self.upper / path.lstrip("/")

    def removed(self, path: str) -> bool:
        """Whether ``path`` is absent on the node as far as the overlay shows changes:
        never written, or deleted (a whiteout: a 0/0 character device)."""
        upper = self.changed_file(path)
        if not upper.exists() and not upper.is_symlink():
            return True
        stat = upper.lstat()
        return (stat.st_mode & 0o170000) == 0o020000 and stat.st_rdev == 0

    def run(self, *argv: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command on the node (nsenter into its namespaces, then the root's shell)."""
        sshd = _child_of(self.pid)
        cmd = ["nsenter", "-t", str(sshd), "-m", "-u", "-n", "-p", "-r", "-w", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)


def _child_of(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if not children:
        raise RuntimeError(f"process {pid} has no child: the node's sshd is gone")
    return int(children[0])


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _keys(work: Path, ssh_dir: Path) -> Path:
    client = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client)],
                   check=True)
    ssh_dir.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(ssh_dir / "host_ed25519")], check=True)
    (ssh_dir / "authorized_keys").write_text((work / "id_ed25519.pub").read_text())
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    return client


def _start_script(lower: Path, upper: Path, overlay_work: Path, merged: Path) -> str:
    m, lo, up = (shlex.quote(str(path)) for path in (merged, lower, upper))
    options = shlex.quote(f"lowerdir={lower},upperdir={upper},workdir={overlay_work}")
    return f"""set -e
if ! mount -t overlay overlay -o {options} {m} 2>/dev/null; then
  cp -a {lo}/. {up}/   # no overlayfs here (nested in a container): a copy
  mount --bind {up} {m}
fi
mount -t proc proc {m}/proc
mount -t sysfs sysfs {m}/sys
mount --rbind /dev {m}/dev
mount -t tmpfs -o mode=755 tmpfs {m}/run
mount -t tmpfs -o mode=1777 tmpfs {m}/tmp
mkdir -p {m}/run/sshd
hostname debian-target
exec chroot {m} /usr/sbin/sshd -D -e -f /etc/ssh/provisioner-test/sshd_config
"""


def _wait_ready(namespace: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        probe = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-Hltn",
                                "sport = :22"], capture_output=True, text=True, check=False)
        if probe.stdout.strip():
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd not listening after {READY_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@contextmanager
def ssh_node(work: Path, files: Mapping[str, tuple[str, int]] | None = None
             ) -> Iterator[SshNode]:
    """A running node; everything (processes, mounts, namespace) is gone afterwards.

    ``files``: path -> (content, mode) put on the node before it starts (the overlay's
    upper dir must not change under a mounted overlay)."""
    root = ensure_debian_root().path
    upper, overlay_work, merged = work / "upper", work / "overlay-work", work / "merged"
    for path in (upper, overlay_work, merged):
        path.mkdir(parents=True)
    for name, (content, mode) in (files or {}).items():
        path = upper / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(mode)
    key = _keys(work, upper / "etc" / "ssh" / "provisioner-test")
    (upper / "etc/ssh/provisioner-test/sshd_config").write_text(
        _SSHD_CONFIG.format(address=NODE_ADDRESS))
    namespace = f"pv{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", namespace)
    proc: subprocess.Popen[bytes] | None = None
    log = work / "sshd.log"
    try:
        _ip("-n", namespace, "link", "set", "lo", "up")
        # a veth pair inside the namespace (the CI kernel has no `dummy` module)
        _ip("-n", namespace, "link", "add", "eth0", "address", NODE_MAC, "type", "veth",
            "peer", "name", "wire0")
        _ip("-n", namespace, "addr", "add", f"{NODE_ADDRESS}/24", "dev", "eth0")
        for link in ("eth0", "wire0"):
            _ip("-n", namespace, "link", "set", link, "up")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", namespace, "unshare", "--mount", "--uts", "--pid",
                 "--fork", "--kill-child", "--propagation", "private", "sh", "-c",
                 _start_script(root, upper, overlay_work, merged)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_ready(namespace, proc, log)
        yield SshNode(namespace=namespace, address=NODE_ADDRESS, mac=NODE_MAC, key=key,
                      upper=upper, pid=proc.pid)
    finally:
        if proc is not None and proc.poll() is None:
            # unshare --fork blocks SIGTERM while it waits for its child: SIGKILL it, and
            # --kill-child takes the node's PID namespace (sshd, sessions) down with it
            proc.kill()
            proc.wait(10)
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
        unmount_under(merged)  # only if the mount namespace leaked (it should not)

