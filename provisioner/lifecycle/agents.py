"""The agent's side of inspection: tokens, fact reports, adoption by serial, commands.

``FactsMailbox`` is the real ``Inspector``: the inspect step waits on it for the facts the
node's agent posts. Reports are validated; a malformed or lying one is refused with a reason
that also goes into the node's history.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from provisioner.agent.facts import FactsError, validate
from provisioner.domain import Node, Role, TokenInfo
from provisioner.errors import InvalidRequest
from provisioner.ids import normalize_mac
from provisioner.lifecycle.agent_binding import (
    AgentBinding,
    RefusalLog,
    SourceRefused,
    canonical_ip,
)
from provisioner.lifecycle.bmclink import BmcLinkPolicy, reported_bmc
from provisioner.lifecycle.callbacks import BootCallbacks, Callback
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.ports import AgentJobQueue, NoAgentJobs
from provisioner.lifecycle.row_budget import RowBudget, with_skipped
from provisioner.lifecycle.states import IN_FLIGHT, NodeState
from provisioner.lifecycle.steps import BOOTED, IMAGE_WRITTEN, INSTALLED
from provisioner.store.repo import NodeChange, NodeRepo
from provisioner.store.tokens import TokenRepo

log = logging.getLogger(__name__)
_MAX_PENDING = 10_000
CONTROLLER_TOKEN_PREFIX = "controller:"
#: an agent report may fold a discovered node into an enrolled one with the same serial only
#: while that one has not been inspected yet; past that, an operator confirms (the API's
#: ``adopt`` action on the discovered node)
ADOPTABLE_BY_REPORT = frozenset({NodeState.ENROLLED, NodeState.INSPECTING,
                                 NodeState.INSPECT_FAILED})


class FactsMailbox:
    """Facts posted by agents, handed to the inspect step waiting for them (an Inspector)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._pending: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def inspect(self, node: Node) -> dict[str, Any]:
        if (facts := self._pending.pop(node.id, None)) is not None:
            return facts
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[node.id] = future
        try:
            return await future
        finally:
            if self._waiting.get(node.id) is future:
                del self._waiting[node.id]

    def deliver(self, node_id: str, facts: dict[str, Any]) -> None:
        future = self._waiting.get(node_id)
        if future is not None and not future.done():
            future.set_result(facts)
            return
        self._pending[node_id] = facts
        self._pending.move_to_end(node_id)
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)

    def wants_report(self, node_id: str) -> bool:
        """A step waits and no facts are in hand: after a daemon restart, say."""
        return node_id in self._waiting and node_id not in self._pending


@dataclass(frozen=True, slots=True)
class ReportResult:
    node_id: str
    token: str | None  # a new token when the report was adopted by another node


class AgentTokens:
    """Single-purpose agent tokens of a node. A node that fetches its script again while its
    token has more than half its life left gets the same one (no writes). A fresh one (the
    cached one is old, or the daemon restarted and rebuilds a deploy's seed) never cuts off
    an agent holding an earlier one mid-step: earlier tokens stay valid until they expire
    (``boot.agent_token_ttl_s``), each bound to its own address; ``revoke`` (the deployed
    OS's callback taken) ends them all. Shared by the boot server and the Ansible ``facts``
    role."""

    def __init__(self, tokens: TokenRepo, *, ttl_s: int,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._tokens = tokens
        self._ttl = timedelta(seconds=ttl_s)
        self._clock = clock
        self._issued: dict[str, tuple[str, datetime]] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def issue_token(self, node_id: str) -> str:
        # one at a time per node: two callers at once (the iPXE script and the deploy
        # step's cloud-init seed) would each revoke the other's fresh token
        async with self._locks[node_id]:
            return await self._issue(node_id)

    async def _issue(self, node_id: str) -> str:
        now = self._clock()
        cached = self._issued.get(node_id)
        if cached is not None and cached[1] - now > self._ttl / 2:
            return cached[0]
        expires = now + self._ttl
        _, token = await self._tokens.replace_for_node(
            f"agent:{node_id}:{secrets.token_hex(4)}", Role.AGENT, node_id=node_id,
            expires_at=expires, keep_valid=True)
        self._issued[node_id] = (token, expires)
        return token

    async def issue_controller_token(self, node_id: str) -> str:
        """A token for the daemon's own host (the Ansible ``facts`` role posts from the
        controller): never sent to the node, accepted only from this host's addresses, so
        the node's address binding does not apply to it (``AgentService.check_source``)."""
        expires = self._clock() + self._ttl
        _, token = await self._tokens.create(
            f"{CONTROLLER_TOKEN_PREFIX}{node_id}:{secrets.token_hex(4)}", Role.AGENT,
            node_id=node_id, expires_at=expires)
        return token

    def forget(self, node_id: str) -> None:
        self._issued.pop(node_id, None)

    async def revoke(self, node_id: str) -> None:
        """Revoke the node's tokens: the next caller gets a fresh one."""
        async with self._locks[node_id]:
            self._issued.pop(node_id, None)
            await self._tokens.revoke_for_node(node_id)


class AgentService:
    def __init__(self, conductor: Conductor, repo: NodeRepo, tokens: TokenRepo,
                 mailbox: FactsMailbox, *, token_ttl_s: int,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 agent_tokens: AgentTokens | None = None,
                 jobs: AgentJobQueue | None = None,
                 callbacks: BootCallbacks | None = None,
                 bmc_link: BmcLinkPolicy | None = None,
                 binding: AgentBinding | None = None) -> None:
        self._conductor = conductor
        self._binding = binding or AgentBinding()
        self._refusals = RefusalLog()
        self._rows = RowBudget()  # history rows of callbacks and later reports
        self._bmc_link = bmc_link
        self._jobs: AgentJobQueue = jobs or NoAgentJobs()
        self._callbacks = callbacks
        self._repo = repo
        self._mailbox = mailbox
        self._agent_tokens = agent_tokens or AgentTokens(tokens, ttl_s=token_ttl_s,
                                                         clock=clock)

    async def issue_token(self, node_id: str) -> str:
        """The node's agent token (see ``AgentTokens``)."""
        return await self._agent_tokens.issue_token(node_id)

    async def check_boot_source(self, node: Node, remote: str | None) -> None:
        """Refuse (``SourceRefused``, with a history row) a boot script, which carries the
        token, to an address other than the one our DHCP server bound for the node."""
        try:
            await self._binding.check_boot(node.id, node.macs, remote)
        except SourceRefused as exc:
            await self._record_refusal(node.id, "boot_refused", remote, str(exc))
            raise

    async def check_source(self, info: TokenInfo, token: str, remote: str | None, *,
                           local: str | None) -> None:
        """Refuse (``SourceRefused``, with a history row) an agent call made with the node's
        token from an address the token is not bound to (``agent_binding``). ``local`` is
        the server's own address on that connection: a controller token works only when the
        call comes from it or from loopback (the daemon's host itself)."""
        assert info.node_id is not None
        node = await self._repo.get(info.node_id)
        try:
            if info.name.startswith(CONTROLLER_TOKEN_PREFIX):
                _check_same_host(node.id, remote, local)
            else:
                await self._binding.check_call(node.id, node.macs, token, remote)
        except SourceRefused as exc:
            await self._record_refusal(node.id, "agent_refused", remote, str(exc))
            raise

    async def _record_refusal(self, node_id: str, event: str, remote: str | None,
                              reason: str) -> None:
        """A history row for the refusal, coalesced per source (``RefusalLog``)."""
        since = self._refusals.note(node_id, event, remote or "")
        if since is None:
            log.debug("node %s: %s: %s", node_id, event, reason)
            return
        if since:
            reason += f" ({since} more refused from there since the last row)"
        await self._conductor.record(node_id, event, actor="network", reason=reason,
                                     level=logging.WARNING)

    async def report(self, node_id: str, mac: str, facts: object) -> ReportResult:
        node = await self._repo.get(node_id)
        try:
            checked = self._check(node, mac, facts)
        except InvalidRequest as exc:
            if (skipped := self._rows.admit(node.id, "report_rejected")) is not None:
                await self._conductor.record(node.id, "report_rejected", actor="agent",
                                             reason=with_skipped(str(exc), skipped),
                                             level=logging.WARNING)
            raise
        serial = checked["system"]["serial"] or None
        target, token = node, None
        if serial and node.serial is None:
            owner = await self._repo.find_by_serial(serial)
            if owner is not None and owner.id != node.id:
                await self._check_adoptable(node, owner, checked)
                target = await self._conductor.adopt(node.id, owner.id, actor="agent")
                self._agent_tokens.forget(node.id)
                token = await self.issue_token(target.id)
            else:
                await self._repo.update_meta(node.id, NodeChange(serial=serial))
        if self._bmc_link is not None:
            target = await self._link_bmc(target, checked, self._bmc_link)
        target = await self._repo.merge_facts(target.id, {"last_report": checked})
        if target.state is NodeState.INSPECTING:
            self._mailbox.deliver(target.id, checked)
        elif (skipped := self._rows.admit(target.id, "facts_reported")) is not None:
            # a later report (the OS is up: the facts role) inspects nothing; recorded,
            # so the topology and operators see fresh GPU and fabric facts
            await self._conductor.record(target.id, "facts_reported", actor="agent",
                                         reason=with_skipped(_report_summary(checked),
                                                             skipped))
        log.info("node %s: facts accepted (serial %s)", target.id, serial)
        return ReportResult(node_id=target.id, token=token)

    async def _check_adoptable(self, node: Node, owner: Node, facts: dict[str, Any]) -> None:
        """A report claiming the serial of a node past inspection, or of one enrolled with
        MACs none of which is a MAC the reporting node booted with, is refused (an attacker
        on the provisioning network could otherwise take over that machine's identity); the
        report is kept on the reporting node so an operator can confirm. The reporting
        node's MACs are the ones our DHCP server and boot server saw it boot with (its agent
        token is bound to their lease); the NICs a report lists are claims and never count."""
        if owner.state not in ADOPTABLE_BY_REPORT:
            why = f"which is {owner.state}"
        elif owner.macs and not set(node.macs) & set(owner.macs):
            why = (f"enrolled with MACs {', '.join(owner.macs)}, none of which it booted "
                   f"with ({', '.join(node.macs) or 'no MAC'})")
        else:
            return
        reason = (f"report from node {node.id} claims serial {owner.serial!r} of node "
                  f"{owner.id}, {why}: adoption needs an operator's confirmation "
                  f"(POST /api/v1/nodes/{node.id}/actions/adopt)")
        if (since := self._refusals.note(node.id, "adopt_refused", owner.id)) is not None:
            await self._repo.merge_facts(node.id, {"last_report": facts})
            row = reason + (f" ({since} more since the last row)" if since else "")
            for who in (node.id, owner.id):
                await self._conductor.record(who, "adopt_refused", actor="agent", reason=row,
                                             level=logging.WARNING)
        raise InvalidRequest(reason)

    async def _link_bmc(self, node: Node, facts: dict[str, Any],
                        policy: BmcLinkPolicy) -> Node:
        """Zero-touch: the BMC the report names becomes the node's (``bmclink``)."""
        bound = False
        reported = facts.get("bmc")
        if isinstance(reported, dict) and node.bmc_mac and reported.get("mac") == node.bmc_mac:
            bound = str(reported.get("ip")) in await self._binding.leased((node.bmc_mac,))
        link = reported_bmc(node, facts, policy, dhcp_bound=bound)
        if link is None:
            return node
        if link.endpoint is not None or link.mac is not None:
            # a move reported here was checked against the subnets or our lease: the
            # enrolled password follows it (a move anywhere else never reaches this)
            node = await self._repo.update_meta(node.id, NodeChange(
                bmc=link.endpoint, bmc_mac=link.mac, keep_bmc_password=True))
        if link.reason:
            await self._conductor.record(node.id, "bmc_linked" if link.endpoint else "bmc",
                                         actor="agent", reason=link.reason)
            log.info("node %s: %s", node.id, link.reason)
        return node

    async def command(self, node_id: str) -> dict[str, Any]:
        node = await self._repo.get(node_id)
        if node.state is NodeState.INSPECTING and self._mailbox.wants_report(node.id):
            return {"command": "report"}
        if node.state in IN_FLIGHT and (job := self._jobs.pending(node.id)) is not None:
            return job
        if node.state in IN_FLIGHT:
            return {"command": "wait", "interval_s": 3}
        return {"command": "poweroff"}

    async def result(self, node_id: str, body: dict[str, Any]) -> None:
        """The agent's report on a job (``deploy``, ``sanitise``, ``storage``) or a power
        command."""
        command, generation = body.get("command"), body.get("generation")
        if command in ("deploy", "sanitise", "storage") and isinstance(generation, str):
            ok, error = body.get("ok") is True, str(body.get("error", ""))[:1000]
            if command == "deploy" and ok and self._jobs.pending(node_id) is not None:
                self._binding.release(node_id)  # the OS, next, may have another address
                await self._conductor.record(node_id, "image_written", actor="agent",
                                             reason=_written(body))
            if not self._jobs.complete(node_id, generation, ok, error, body):
                log.info("node %s: stale %s result for %s ignored", node_id, command,
                         generation)

    async def image_written(self, node_id: str) -> bool:
        """The deploying node's image is on its disk: it must boot that, not the ramdisk
        again (a firmware that ignored the one-time disk boot, a node without a BMC)."""
        node = await self._repo.get(node_id)  # fresh: checkpoints do not clear boot caches
        return node.state is NodeState.DEPLOYING and IMAGE_WRITTEN in node.checkpoint

    def seed(self, node_id: str, generation: str) -> bytes | None:
        """The cloud-init seed of the node's pending deploy (``generation``), if any."""
        return self._jobs.seed(node_id, generation)

    async def callback(self, node_id: str, body: dict[str, Any], *,
                       remote: str | None = None) -> bool:
        """The deployed OS (or an installer) says it is up: the waiting deploy step's answer
        and a history row. True when a step was waiting for it. Only while the node's deploy
        waits for this callback (``expects_callback``) does it change anything: the OS is
        then reached (Ansible, ``configuring``) at ``facts.address``, the address our DHCP
        server bound for the node (else the address the token is bound to: the call's
        source), with the host keys the callback delivered (``facts.ssh_host_keys``). Any
        other callback is ignored with a coalesced history row; one whose body claims
        another address than its source is refused (422)."""
        callback = Callback.parse(body)  # InvalidRequest: 422
        node = await self._repo.get(node_id)
        source = canonical_ip(remote)
        if callback.address is not None and canonical_ip(callback.address) != source:
            reason = (f"{callback.event} callback from {source or 'an unknown address'} "
                      f"claims address {callback.address[:64]!r}: refused")
            await self._record_refusal(node_id, "callback_refused", remote, reason)
            raise InvalidRequest(reason)
        if not self._expects_callback(node):
            await self._record_refusal(
                node_id, "callback_ignored", remote,
                f"{callback.event} callback from {source or 'an unknown address'} while no "
                f"deploy step waits for one (node {node.state}): ignored")
            return False
        leased = await self._binding.leased(node.macs)
        address = min(leased) if leased and source not in leased else source
        if callback.event == "installed":  # the installed OS, next, may have another address
            self._binding.release(node_id)
        facts: dict[str, Any] = {"ssh_host_keys": list(callback.host_keys)}
        if address is not None:
            facts["address"] = address
        node = await self._repo.merge_facts(node_id, facts)
        where = f" from {source}" if source is not None else ""
        keys = f", {len(callback.host_keys)} SSH host keys" if callback.host_keys else ""
        await self._conductor.record(node_id, callback.event, actor="node",
                                     reason=f"hostname {callback.hostname!r}{where}{keys}")
        if self._callbacks is None:
            return False
        waited = self._callbacks.deliver(node_id, callback)
        if waited:  # the token sits in the seed on the node's disk: used up now
            await self._agent_tokens.revoke(node_id)
        return waited

    def _expects_callback(self, node: Node) -> bool:
        """The node's deploy waits (or is about to wait) for the OS's callback: its image is
        written (or it runs an installer) and no callback was taken yet."""
        if self._callbacks is None or node.state is not NodeState.DEPLOYING:
            return False
        if BOOTED in node.checkpoint or INSTALLED in node.checkpoint:
            return False
        return IMAGE_WRITTEN in node.checkpoint or self._callbacks.uses_installer(node)

    def _check(self, node: Node, mac: str, facts: object) -> dict[str, Any]:
        try:
            booting = normalize_mac(mac) if mac else None
        except InvalidRequest:
            raise InvalidRequest(f"mac: {mac!r} is not a MAC address") from None
        if booting is not None and node.macs and booting not in node.macs:
            raise InvalidRequest(f"mac: {booting} is not a MAC of node {node.id}")
        try:
            checked = validate(facts, booting_mac=booting)
        except FactsError as exc:
            raise InvalidRequest(f"facts refused: {exc}") from None
        reported = {nic["mac"] for nic in checked["nics"]}
        if node.macs and not reported & set(node.macs):
            raise InvalidRequest("facts refused: none of the node's MACs is among the NICs")
        serial = checked["system"]["serial"]
        if node.serial and serial and serial != node.serial:
            raise InvalidRequest(f"facts refused: serial {serial!r} is not this node's "
                                 f"({node.serial!r})")
        return checked



def _check_same_host(node_id: str, remote: str | None, local: str | None) -> None:
    address = canonical_ip(remote)
    if address is None or not (ipaddress.ip_address(address).is_loopback
                               or address == canonical_ip(local)):
        raise SourceRefused(f"controller token of node {node_id} used from "
                            f"{address or 'an unknown address'}, not from the daemon's host")


def _report_summary(facts: dict[str, Any]) -> str:
    ports = sum(len(hca.get("ports", [])) for hca in facts.get("infiniband", []))
    parts = [f"{len(facts.get('gpus', []))} GPUs", f"{ports} InfiniBand ports"]
    if facts.get("nvidia_smi_xml"):
        parts.append("nvidia-smi -q -x")
    if isinstance(diag := facts.get("dcgm_diag"), dict) and diag.get("ran"):
        parts.append("DCGM diag " + ("passed" if diag.get("passed") else "failed"))
    return "facts report: " + ", ".join(parts)


def _written(body: dict[str, Any]) -> str:
    """The history line of a written image: what the agent checked and changed."""
    if body.get("note"):
        return str(body["note"])[:500]
    size = body.get("bytes")
    parts = [f"sha256 {str(body.get('sha256', '?'))[:64]} verified",
             f"{size if isinstance(size, int) else '?'} bytes written"]
    if body.get("layout"):
        parts.append(str(body["layout"])[:300])
    return "; ".join(parts)
