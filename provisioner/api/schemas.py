"""API models (pydantic), distinct from the table models: what the REST API reads and writes.

Request models forbid unknown fields, so a typo is a 422 rather than a silently ignored key.
Credentials are ``SecretStr`` on the way in and only ``password_set`` on the way out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Final, Literal

from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    RootModel,
    SecretStr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from provisioner.api.hardware import hardware_summary
from provisioner.domain import HistoryEntry, Node
from provisioner.errors import InvalidRequest
from provisioner.ids import normalize_mac
from provisioner.lifecycle.states import NodeState

_LABEL: Final = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_ONE_LINE: Final = r"^[^\x00-\x1f\x7f]*$"
_MAC_SEPARATORS: Final = re.compile(r"[\s;,]+")
MAX_MACS: Final = 64
MAX_OFFSET: Final = 10**9


def _hostname(value: str) -> str:
    name = value.strip().lower()
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{value[:80]!r} is not an RFC 1123 host name (labels of a-z, 0-9 "
                         "and '-', 1-63 characters, not starting or ending with '-')")
    return name


def _mac(value: str) -> str:
    if len(value) > 64:
        raise ValueError("not a MAC address (too long)")
    try:
        return normalize_mac(value)
    except InvalidRequest as exc:
        raise ValueError(str(exc)) from None


def _split_macs(value: object) -> object:
    if isinstance(value, str):
        return [part for part in _MAC_SEPARATORS.split(value) if part]
    return value


def _unique_macs(macs: list[str]) -> list[str]:
    if len(set(macs)) != len(macs):
        raise ValueError("the same MAC address is listed twice")
    return macs


def _utf8_secret(value: SecretStr) -> SecretStr:
    try:
        value.get_secret_value().encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return value


def _text(max_length: int, pattern: str = _ONE_LINE) -> StringConstraints:
    return StringConstraints(strip_whitespace=True, min_length=1, max_length=max_length,
                             pattern=pattern)


Hostname = Annotated[str, AfterValidator(_hostname)]
Serial = Annotated[str, _text(128)]
Profile = Annotated[str, _text(128, r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Rack = Annotated[str, _text(128)]
Position = Annotated[str, _text(64)]
Mac = Annotated[str, AfterValidator(_mac)]
Macs = Annotated[list[Mac], Field(max_length=MAX_MACS), AfterValidator(_unique_macs)]
Address = Annotated[str, _text(255, r"^[^\x00-\x20\x7f]+$")]
Username = Annotated[str, _text(255)]
Password = Annotated[SecretStr, AfterValidator(_utf8_secret)]
Port = Annotated[int, Field(ge=1, le=65535)]
BmcDriver = Literal["ipmi", "redfish", "fake"]
Reason = Annotated[str, StringConstraints(strip_whitespace=True, max_length=1024,
                                          pattern=_ONE_LINE)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PagedQuery(_Request):
    """A query with a ``limit``: at most the configured ``page_size_max`` (validation
    context), for every paged listing."""

    @field_validator("limit", check_fields=False)
    @classmethod
    def _limit_max(cls, value: int, info: ValidationInfo) -> int:
        most = info.context.get("page_size_max") if isinstance(info.context, dict) else None
        if isinstance(most, int) and value > most:
            raise ValueError(f"must be at most {most}")
        return value


# -- requests -------------------------------------------------------------------------------


class BmcIn(_Request):
    driver: BmcDriver
    address: Address
    port: Port | None = None
    username: Username | None = None
    password: Password | None = None


class EnrollRequest(_Request):
    """Enrol a machine; at least one of hostname, serial or a MAC identifies it."""

    hostname: Hostname | None = None
    serial: Serial | None = None
    macs: Macs = []
    profile: Profile | None = None
    rack: Rack | None = None
    position: Position | None = None
    bmc: BmcIn | None = None

    @model_validator(mode="after")
    def _identified(self) -> EnrollRequest:
        if self.hostname is None and self.serial is None and not self.macs:
            raise ValueError("at least one of hostname, serial or macs is required")
        return self


class ActionRequest(_Request):
    reason: Reason = ""
    confirm: bool = Field(False, description="Needed for what loses data: deploy (re-image) "
                          "of an active node")


def _many(value: object) -> object:
    return (value,) if isinstance(value, str) else value


class NodeListQuery(PagedQuery):
    """Query parameters of ``GET /nodes``; ``q`` matches part of a hostname, serial or MAC.
    ``state``, ``rack`` and ``profile`` may repeat: a node matches any of their values."""

    state: Annotated[tuple[NodeState, ...], BeforeValidator(_many),
                     Field(min_length=1, max_length=64)] | None = None
    rack: Annotated[tuple[Rack, ...], BeforeValidator(_many),
                    Field(min_length=1, max_length=64)] | None = None
    profile: Annotated[tuple[Profile, ...], BeforeValidator(_many),
                       Field(min_length=1, max_length=64)] | None = None
    maintenance: bool | None = None
    q: Annotated[str, _text(253)] | None = None
    limit: int = Field(100, ge=1, description="Page size (at most the configured maximum)")
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    include: Literal["facts"] | None = Field(
        None, description="facts: each item carries the node's facts (one request per page "
                          "instead of one per node, e.g. the Ansible inventory)")


class ImportRow(_Request):
    """One expected machine of an inventory import (a CSV row or a JSON object)."""

    serial: Serial
    hostname: Hostname | None = None
    rack: Rack | None = None
    position: Position | None = None
    profile: Profile | None = None
    macs: Annotated[Macs, BeforeValidator(_split_macs)] = []
    bmc_driver: BmcDriver | None = None
    bmc_address: Address | None = None
    bmc_port: Port | None = None
    bmc_username: Username | None = None
    bmc_password: Password | None = None
    state: Literal["enrolled", "active"] | None = Field(
        None, description="active: the machine already runs its OS; it is registered as "
        "active (brownfield adoption: no inspection, no disk write)")

    @model_validator(mode="after")
    def _bmc_complete(self) -> ImportRow:
        given = (self.bmc_driver, self.bmc_address, self.bmc_port, self.bmc_username,
                 self.bmc_password)
        if any(v is not None for v in given) and None in given[:2]:
            raise ValueError("bmc_driver and bmc_address are required with any bmc_ field")
        return self


class ImportEnvelope(_Request):
    machines: list[ImportRow]


ImportDocument = RootModel[list[ImportRow] | ImportEnvelope]
"""The JSON body of an import: a list of machines or ``{"machines": [...]}``."""


# -- responses ------------------------------------------------------------------------------


class BmcOut(BaseModel):
    driver: str
    address: str
    port: int | None
    username: str | None
    password_set: bool


class NodeOut(BaseModel):
    id: str
    hostname: str | None
    serial: str | None
    macs: list[str]
    state: NodeState
    maintenance: bool
    maintenance_reason: str
    profile: str | None
    rack: str | None
    position: str | None
    step_status: str | None = Field(description="queued, running, held (maintenance) or null")
    last_error: str
    bmc: BmcOut | None
    power_state: Literal["on", "off"] | None = Field(
        description="Last power state the daemon set or read from the BMC (steps, operator "
                    "requests, the periodic power sync); null before the first")
    hardware: str = Field("", description="What the inspected facts say the machine is "
                                          "(GPUs, InfiniBand, CPU, memory, disks); empty "
                                          "before the first inspection")
    created_at: datetime
    updated_at: datetime


class HistoryOut(BaseModel):
    seq: int
    event: str
    from_state: str
    to_state: str
    actor: str
    reason: str
    at: datetime
    instance: str | None = None  # the daemon that wrote the row
    fence: int | None = None  # its lease's fencing number, for a step's writes


class NodeDetailOut(NodeOut):
    facts: dict[str, JsonValue]
    checkpoint: list[str]
    allowed_actions: list[str]
    history: list[HistoryOut]


class NodePage(BaseModel):
    items: list[NodeOut]
    total: int
    limit: int
    offset: int


class HistoryPage(BaseModel):
    items: list[HistoryOut]


class ImportChange(BaseModel):
    serial: str
    action: Literal["create", "update", "unchanged", "refused"]
    node: str | None = Field(description="the node's id; null for one a dry run would create")
    changes: list[str]
    notes: list[str]


class ImportResult(BaseModel):
    created: list[str]
    updated: list[str]
    errors: list[str]
    dry_run: bool = False
    changes: list[ImportChange] = Field(
        default_factory=list, description="per machine, what the import changed (or, dry, "
        "would change)")


class Health(BaseModel):
    status: str


class ErrorItem(BaseModel):
    loc: str = Field(description="The field, dotted (bmc.port), or the query parameter")
    msg: str
    type: str
    row: int | None = Field(None, description="Import only: 1 is the first machine")


class Problem(BaseModel):
    """An RFC 9457 problem document (``application/problem+json``)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[ErrorItem] | None = None
    state: str | None = Field(None, description="409 invalid transition: the node's state")
    allowed_events: list[str] | None = Field(None, description="409: events allowed there")


class InvalidRows(InvalidRequest):
    """Rows of an inventory import are invalid; nothing was imported."""

    def __init__(self, errors: Sequence[ErrorItem]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(f"{len(self.errors)} error(s) in the import, nothing imported; "
                         f"first: row {first.row}: {first.loc}: {first.msg}")


def error_items(exc: ValidationError, *, row: int | None = None) -> list[ErrorItem]:
    """The field errors of ``exc``, without the offending input (it may be a password)."""
    return [ErrorItem(loc=".".join(str(part) for part in error["loc"]) or "(body)",
                      msg=error["msg"], type=error["type"], row=row)
            for error in exc.errors(include_input=False, include_url=False)]


# -- conversions ----------------------------------------------------------------------------


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def node_out(node: Node, step_status: str | None) -> NodeOut:
    return NodeOut(**_node_fields(node, step_status))


def node_detail(node: Node, step_status: str | None, history: Sequence[HistoryEntry],
                allowed_actions: Sequence[str]) -> NodeDetailOut:
    return NodeDetailOut(**_node_fields(node, step_status), facts=node.facts,
                         checkpoint=list(node.checkpoint), allowed_actions=list(allowed_actions),
                         history=[history_out(entry) for entry in history])


def _node_fields(node: Node, step_status: str | None) -> dict[str, object]:
    bmc = None
    if node.bmc is not None:
        bmc = BmcOut(driver=node.bmc.driver, address=node.bmc.address, port=node.bmc.port,
                     username=node.bmc.username, password_set=node.bmc.password_set)
    return {"id": node.id, "hostname": node.hostname, "serial": node.serial,
            "macs": list(node.macs), "state": node.state, "maintenance": node.maintenance,
            "maintenance_reason": node.maintenance_reason, "profile": node.profile,
            "rack": node.rack, "position": node.position, "step_status": step_status,
            "last_error": node.last_error, "bmc": bmc,
            "power_state": node.power_state if node.power_state in ("on", "off") else None,
            "hardware": hardware_summary(node.facts),
            "created_at": _utc(node.created_at),
            "updated_at": _utc(node.updated_at)}


def history_out(entry: HistoryEntry) -> HistoryOut:
    return HistoryOut(seq=entry.seq, event=entry.event, from_state=entry.from_state,
                      to_state=entry.to_state, actor=entry.actor, reason=entry.reason,
                      at=_utc(entry.at), instance=entry.instance, fence=entry.fence)


# -- bodies ---------------------------------------------------------------------------------


def parse_json(raw: bytes) -> object:
    """Decode a JSON body; raise 400 (never 500) on bytes that are not JSON."""
    try:
        value: object = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise web.HTTPBadRequest(text=f"body is not valid JSON: {_first_line(exc)}") from None
    return value


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def respond(model: BaseModel, *, status: int = 200,
            headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(text=model.model_dump_json(), status=status, headers=headers,
                        content_type="application/json")


# -- power and boot device (BMC) ------------------------------------------------------------


class PowerRequest(_Request):
    action: Literal["on", "off", "soft-off", "cycle", "status"] = Field(
        description="on/off/cycle are confirmed by read-back; soft-off asks the OS (ACPI)")
    confirm: bool = Field(False, description="Needed to power off or cycle a node that "
                          "Slurm reports running jobs (ALLOCATED or MIXED)")


class BootDeviceRequest(_Request):
    device: Literal["pxe", "disk", "http", "bios"]
    persistent: bool = Field(False, description="false: next boot only")
    uefi: bool = Field(True, description="UEFI (true) or legacy BIOS (false) boot")


class PowerOut(BaseModel):
    action: str
    power_state: Literal["on", "off"] = Field(description="As read back from the BMC")
    node: NodeOut


class BootDeviceOut(BaseModel):
    device: str
    persistent: bool
    uefi: bool
    node: NodeOut
