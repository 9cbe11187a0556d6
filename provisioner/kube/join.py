"""Per-node bootstrap tokens and the ``JoinTicket`` handed to the ``kubeadm join`` playbook.

One token per node (Secret ``kube-system/bootstrap-token-<id>``, expiring after minutes,
group ``system:bootstrappers:kubeadm:default-node-token``), deleted after the join or when it
fails. The CA pin is ``sha256:`` over the CA certificate's DER SubjectPublicKeyInfo (kubeadm's
``--discovery-token-ca-cert-hash``); the endpoint comes from ``kube-public/cluster-info``.
Tokens are never logged: only their public id is.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import string
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from provisioner.domain import Node
from provisioner.kube.labels import label_value
from provisioner.kube.model import LABEL_NODE_ID, ClusterInfo, KubeConflict, KubeRejected

log = logging.getLogger(__name__)
NAMESPACE = "kube-system"
TOKEN_TYPE = "bootstrap.kubernetes.io/token"
NODE_GROUP = "system:bootstrappers:kubeadm:default-node-token"
_ALPHABET = string.ascii_lowercase + string.digits
_CREATE_TRIES = 3


@dataclass(frozen=True, slots=True)
class JoinTicket:
    """What ``kubeadm join`` needs. The token is a credential: repr hides it."""

    server: str  # https://host:port
    token: str = field(repr=False)
    ca_cert_hashes: tuple[str, ...]

    @property
    def token_id(self) -> str:
        return self.token.partition(".")[0]

    @property
    def endpoint(self) -> str:
        """``host:port`` as ``kubeadm join`` takes it."""
        parts = urlsplit(self.server)
        return parts.netloc or self.server


# The playbook runner (another issue) does the join; injected so the step stays testable.
RunJoin = Callable[[JoinTicket, Node], Awaitable[None]]


class SecretStore(Protocol):
    async def create_secret(self, namespace: str, name: str, *, type_: str,
                            string_data: Mapping[str, str],
                            labels: Mapping[str, str] | None = None) -> None: ...

    async def delete_secret(self, namespace: str, name: str) -> bool: ...

    async def delete_secrets(self, namespace: str, label_selector: str) -> list[str]: ...

    async def cluster_info(self) -> ClusterInfo: ...


def new_token() -> str:
    """``<6>.<16>`` from ``[a-z0-9]`` (kubeadm's bootstrap token format)."""
    pick = secrets.choice
    return "".join(pick(_ALPHABET) for _ in range(6)) + "." + "".join(
        pick(_ALPHABET) for _ in range(16))


def ca_cert_hashes(ca_pem: bytes) -> tuple[str, ...]:
    """``sha256:<hex>`` of each CA certificate's DER SubjectPublicKeyInfo."""
    try:
        certs = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise KubeRejected(f"cluster CA is not a PEM certificate: {exc}") from None
    return tuple("sha256:" + hashlib.sha256(cert.public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo)).hexdigest() for cert in certs)


def token_secret(token: str, node: Node, expires: datetime) -> dict[str, str]:
    token_id, _, secret = token.partition(".")
    return {
        "token-id": token_id,
        "token-secret": secret,
        "expiration": expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "usage-bootstrap-authentication": "true",
        "usage-bootstrap-signing": "true",
        "auth-extra-groups": NODE_GROUP,
        "description": f"provisioner: kubeadm join of {node.hostname} (node {node.id})",
    }


class BootstrapTokens:
    def __init__(self, client: SecretStore, *, ttl_s: float,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 make_token: Callable[[], str] = new_token) -> None:
        self._client = client
        self._ttl = timedelta(seconds=ttl_s)
        self._now = now
        self._make_token = make_token

    async def create(self, node: Node) -> JoinTicket:
        """A new token for ``node``; one a crashed earlier run left behind is deleted first."""
        selector = f"{LABEL_NODE_ID}={label_value(str(node.id))}"
        for name in await self._client.delete_secrets(NAMESPACE, selector):
            log.info("node %s: stale bootstrap token %s deleted", node.id,
                     name.removeprefix("bootstrap-token-"))
        info = await self._client.cluster_info()
        hashes = ca_cert_hashes(info.ca_pem)
        for _ in range(_CREATE_TRIES):
            token = self._make_token()
            try:
                await self._client.create_secret(
                    NAMESPACE, f"bootstrap-token-{token.partition('.')[0]}", type_=TOKEN_TYPE,
                    string_data=token_secret(token, node, self._now() + self._ttl),
                    labels={LABEL_NODE_ID: label_value(str(node.id))})
            except KubeConflict:
                continue  # token id taken (1 in 2 billion): draw another
            ticket = JoinTicket(server=info.server, token=token, ca_cert_hashes=hashes)
            log.info("node %s: bootstrap token %s created", node.id, ticket.token_id)
            return ticket
        raise KubeConflict(f"node {node.id}: no free bootstrap token id after {_CREATE_TRIES}")

    async def delete(self, ticket: JoinTicket) -> None:
        if await self._client.delete_secret(NAMESPACE, f"bootstrap-token-{ticket.token_id}"):
            log.info("bootstrap token %s deleted", ticket.token_id)

    @asynccontextmanager
    async def ticket(self, node: Node) -> AsyncIterator[JoinTicket]:
        """A ticket valid inside the block; its token is deleted on the way out, however the
        block ends (the delete is shielded from cancellation)."""
        ticket = await self.create(node)
        try:
            yield ticket
        finally:
            await asyncio.shield(self.delete(ticket))
