"""``POST /api/v1/inventory/import``: expected machines as CSV or JSON.

Query flags: ``dry_run`` (plan and report every change, write nothing),
``allow_live_changes`` (rename or re-profile an active or in-flight node), ``prune_macs``
(remove a known node's MACs its row does not list). An unknown profile name is a 422 for the
whole import, like a malformed row (the registry: ``GET /api/v1/profiles``).

Every row is validated before anything is written: one bad row is a 422 listing every bad
row, and nothing is imported. Rows number from 1, the first machine (the line after the CSV
header); ``errors`` in a 200 are per-machine failures of the import itself (a clash with an
existing node).
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from collections.abc import Iterable, Sequence
from typing import Final

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from provisioner.api import CONDUCTOR, NODES, PRINCIPAL, PROFILES, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import (
    ErrorItem,
    ImportChange,
    ImportDocument,
    ImportResult,
    ImportRow,
    InvalidRows,
    error_items,
    parse_json,
    respond,
)
from provisioner.config.profiles import ProfileRegistry
from provisioner.domain import BmcEndpoint, NodeState, Role
from provisioner.errors import InvalidRequest
from provisioner.lifecycle.inventory import ExpectedMachine, ImportOptions, import_machines

log = logging.getLogger(__name__)

PATH: Final = "/api/v1/inventory/import"
COLUMNS: Final = tuple(ImportRow.model_fields)
_CSV: Final = "text/csv"
_JSON: Final = "application/json"


class ImportQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dry_run: bool = False
    allow_live_changes: bool = False
    prune_macs: bool = False


async def import_inventory(request: web.Request) -> web.Response:
    query = ImportQuery.model_validate(dict(request.query))
    raw = await request.read()
    rows = await asyncio.to_thread(parse_inventory, request.content_type, raw)
    check_profiles(rows, request.app.get(PROFILES) or ProfileRegistry())
    options = ImportOptions(dry_run=query.dry_run, allow_live_changes=query.allow_live_changes,
                            prune_macs=query.prune_macs,
                            may_change_bmc=request[PRINCIPAL].role.allows(Role.ADMIN))
    report = await import_machines([_machine(row) for row in rows], actor=actor(request),
                                   conductor=request.app[CONDUCTOR], repo=request.app[NODES],
                                   options=options)
    log.info("inventory import by %s%s: %d created, %d updated, %d failed", actor(request),
             " (dry run)" if query.dry_run else "", len(report.created), len(report.updated),
             len(report.errors))
    changes = [ImportChange(serial=p.serial, action=p.action,
                            node=p.node, changes=list(p.changes), notes=list(p.notes))
               for p in report.planned]
    return respond(ImportResult(created=report.created, updated=report.updated,
                                errors=report.errors, dry_run=query.dry_run, changes=changes))


def check_profiles(rows: Sequence[ImportRow], registry: ProfileRegistry) -> None:
    """An unknown profile name is a bad row (422 for the whole import)."""
    errors: list[ErrorItem] = []
    for number, row in enumerate(rows, start=1):
        try:
            registry.check(row.profile)
        except InvalidRequest as exc:
            errors.append(ErrorItem(loc="profile", msg=str(exc), type="unknown_profile",
                                    row=number))
    if errors:
        raise InvalidRows(errors)


def parse_inventory(content_type: str, raw: bytes) -> list[ImportRow]:
    """Parse and validate a whole import body (in a worker thread: it may be megabytes).

    Raises 400 (not CSV or JSON), 415 (another media type) or InvalidRows (422)."""
    if content_type == _CSV:
        records = _csv_records(raw)
    elif content_type == _JSON:
        records = _json_records(parse_json(raw))
    else:
        raise web.HTTPUnsupportedMediaType(
            text=f"Content-Type must be {_CSV} or {_JSON}, not {content_type!r}")
    return _validate(records)


def _csv_records(raw: bytes) -> list[object]:
    try:
        reader = csv.DictReader(io.StringIO(raw.decode("utf-8-sig"), newline=""), strict=True)
        header = [name.strip().lower() for name in reader.fieldnames or ()]
        _check_header(header)
        reader.fieldnames = header
        return list(reader)
    except UnicodeDecodeError as exc:
        raise web.HTTPBadRequest(text=f"CSV body is not UTF-8: {exc}") from None
    except csv.Error as exc:
        raise web.HTTPBadRequest(text=f"malformed CSV: {exc}") from None


def _check_header(header: Sequence[str]) -> None:
    unknown = sorted(set(header) - set(COLUMNS))
    if unknown:
        raise InvalidRequest(f"unknown CSV column(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(COLUMNS)}")
    if "serial" not in header:
        raise InvalidRequest("the CSV header row must name a 'serial' column")
    if len(set(header)) != len(header):
        raise InvalidRequest("a CSV column is named twice in the header row")


def _json_records(document: object) -> list[object]:
    if isinstance(document, dict) and set(document) == {"machines"}:
        document = document["machines"]
    if not isinstance(document, list):
        raise InvalidRequest('expected a JSON list of machines or {"machines": [...]}')
    return document


def _validate(records: Sequence[object]) -> list[ImportRow]:
    rows: list[ImportRow] = []
    errors: list[ErrorItem] = []
    for number, record in enumerate(records, start=1):
        if isinstance(record, dict) and None in record:  # csv.DictReader's surplus fields
            errors.append(ErrorItem(loc="(row)", msg="more fields than the header row",
                                    type="csv_fields", row=number))
            continue
        try:
            rows.append(ImportRow.model_validate(_without_blanks(record)))
        except ValidationError as exc:
            errors.extend(error_items(exc, row=number))
    if not errors:
        errors = _duplicates(rows)
    if errors:
        raise InvalidRows(errors)
    return rows


def _without_blanks(record: object) -> object:
    """Empty CSV cells (and empty JSON strings or nulls) mean "not given"."""
    if not isinstance(record, dict):
        return record
    return {key: value for key, value in record.items()
            if value is not None and not (isinstance(value, str) and not value.strip())}


def _duplicates(rows: Sequence[ImportRow]) -> list[ErrorItem]:
    errors: list[ErrorItem] = []
    seen: dict[tuple[str, str], int] = {}
    for number, row in enumerate(rows, start=1):
        for key in _unique_keys(row):
            first = seen.setdefault(key, number)
            if first != number:
                errors.append(ErrorItem(loc=key[0], msg=f"{key[1]!r} is also in row {first}",
                                        type="duplicate", row=number))
    return errors


def _unique_keys(row: ImportRow) -> Iterable[tuple[str, str]]:
    yield "serial", row.serial
    if row.hostname is not None:
        yield "hostname", row.hostname
    for mac in row.macs:
        yield "macs", mac


def _machine(row: ImportRow) -> ExpectedMachine:
    bmc = None
    if row.bmc_driver is not None and row.bmc_address is not None:
        bmc = BmcEndpoint(driver=row.bmc_driver, address=row.bmc_address, port=row.bmc_port,
                          username=row.bmc_username)
    password = row.bmc_password.get_secret_value() if row.bmc_password else None
    return ExpectedMachine(serial=row.serial, hostname=row.hostname, rack=row.rack,
                           position=row.position, profile=row.profile, macs=tuple(row.macs),
                           bmc=bmc, bmc_password=password,
                           state=NodeState(row.state) if row.state else None)


class ProfileOut(BaseModel):
    name: str
    sections: list[str] = Field(description="the configuration sections that define it")


class ProfileList(BaseModel):
    items: list[ProfileOut]
    enforced: bool = Field(description="false when the configuration defines no profile: "
                           "then any name is accepted")


async def list_profiles(request: web.Request) -> web.Response:
    registry = request.app.get(PROFILES) or ProfileRegistry()
    return respond(ProfileList(
        items=[ProfileOut(name=name, sections=list(where))
               for name, where in registry.sections.items()],
        enforced=bool(registry.sections)))


ROUTES: Final = (
    Route("GET", "/api/v1/profiles", list_profiles,
          "The profiles the configuration defines, and where; a node's profile must be one",
          Role.VIEWER, ProfileList),
    Route("POST", PATH, import_inventory,
          "Import expected machines (serial -> hostname, rack, profile, MACs, BMC, state) "
          "from CSV or JSON; dry_run reports the changes and writes nothing; an active or "
          "in-flight node is renamed or re-profiled only with allow_live_changes; MACs a row "
          "does not list are removed only with prune_macs; a rotated BMC password is never "
          "put back; a row that changes a known node's BMC needs the admin role, and a moved "
          "BMC its password; state=active registers a running machine (no disk write)",
          Role.OPERATOR, ImportResult, body=ImportDocument, text_bodies=(_CSV,),
          query=ImportQuery,
          errors=(400, 413, 415, 422)),
)
