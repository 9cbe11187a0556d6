"""API models of an operator's node edits (issue 30): edit, delete, replace, bulk actions."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field, JsonValue, model_validator

from provisioner.api.schemas import (
    HistoryOut,
    Hostname,
    NodeOut,
    Position,
    Profile,
    Rack,
    Reason,
    _many,
    _node_fields,
    _Request,
)
from provisioner.domain import Node, NodeState


class NodeEditRequest(_Request):
    """The fields to change; ``null`` clears one, an absent field is left alone. Renaming
    or re-profiling an active or in-flight node needs ``force``."""

    hostname: Hostname | None = None
    rack: Rack | None = None
    position: Position | None = None
    profile: Profile | None = None
    reason: Reason = ""
    force: bool = False

    @model_validator(mode="after")
    def _something(self) -> NodeEditRequest:
        if not self.changes():
            raise ValueError("give at least one of hostname, rack, position, profile")
        return self

    def changes(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in ("hostname", "rack", "position", "profile")
                if name in self.model_fields_set}


class ReplaceRequest(_Request):
    """``with``: the new chassis (id, hostname, serial or MAC) that takes this retired
    node's hostname, rack and position."""

    with_: Annotated[str, Field(alias="with", min_length=1, max_length=253)]
    reason: Reason = ""


class ReplaceResult(BaseModel):
    old: NodeOut
    new: NodeOut


class DeletedNode(BaseModel):
    """The deleted node as it was, with the history it had: the record leaves with the
    caller (the daemon keeps no copy; its journal has one line per deletion)."""

    node: NodeOut
    history: list[HistoryOut]


class BulkFilter(_Request):
    """Nodes matching every field given (a list matches any of its values)."""

    state: Annotated[tuple[NodeState, ...], BeforeValidator(_many),
                     Field(min_length=1, max_length=64)] | None = None
    rack: Annotated[tuple[Rack, ...], BeforeValidator(_many),
                    Field(min_length=1, max_length=64)] | None = None
    profile: Annotated[tuple[Profile, ...], BeforeValidator(_many),
                       Field(min_length=1, max_length=64)] | None = None
    maintenance: bool | None = None
    q: Annotated[str, Field(min_length=1, max_length=253)] | None = None

    @model_validator(mode="after")
    def _narrowed(self) -> BulkFilter:
        if not self.model_fields_set:
            raise ValueError("an empty filter would match the whole fleet: name at least one "
                             "of state, rack, profile, maintenance, q")
        return self


class BulkActionRequest(_Request):
    """One action on every node the filter matches. ``dry_run``: only list them; ``max``:
    refuse (409, nothing done) when more nodes match."""

    filter: BulkFilter
    action: Annotated[str, Field(min_length=1, max_length=32)]
    reason: Reason = ""
    dry_run: bool = False
    max: int = Field(20, ge=1, le=10_000)


class BulkNode(BaseModel):
    id: str
    hostname: str | None
    state: NodeState
    error: str | None = None


class BulkActionResult(BaseModel):
    action: str
    dry_run: bool
    total: int = Field(description="How many nodes the filter matches")
    max: int
    matched: list[BulkNode] = Field(description="The nodes acted on (dry run: that would be; "
                                                "at most ``max``)")
    applied: list[BulkNode]
    failed: list[BulkNode]


class NodeFactsOut(NodeOut):
    """A listed node with its facts (``GET /nodes?include=facts``)."""

    facts: dict[str, JsonValue]


class NodeFactsPage(BaseModel):
    items: list[NodeFactsOut]
    total: int
    limit: int
    offset: int


def node_with_facts(node: Node, step_status: str | None) -> NodeFactsOut:
    return NodeFactsOut(**_node_fields(node, step_status), facts=node.facts)
