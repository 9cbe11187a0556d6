"""``POST /api/v1/inventory/import``: expected machines as CSV or JSON.

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
from pydantic import ValidationError

from provisioner.api import CONDUCTOR, NODES, PRINCIPAL, actor
from provisioner.api.openapi import Route
from provisioner.api.schemas import (
    ErrorItem,
    ImportDocument,
    ImportResult,
    ImportRow,
    InvalidRows,
    error_items,
    parse_json,
    respond,
)
from provisioner.domain import BmcEndpoint, Role
from provisioner.errors import InvalidRequest
from provisioner.lifecycle.inventory import ExpectedMachine, import_machines

log = logging.getLogger(__name__)

PATH: Final = "/api/v1/inventory/import"
COLUMNS: Final = tuple(ImportRow.model_fields)
_CSV: Final = "text/csv"
_JSON: Final = "application/json"


async def import_inventory(request: web.Request) -> web.Response:
    raw = await request.read()
    rows = await asyncio.to_thread(parse_inventory, request.content_type, raw)
    may_change_bmc = request[PRINCIPAL].role.allows(Role.ADMIN)
    report = await import_machines([_machine(row) for row in rows], actor=actor(request),
                                   conductor=request.app[CONDUCTOR], repo=request.app[NODES],
                                   may_change_bmc=may_change_bmc)
    log.info("inventory import by %s: %d created, %d updated, %d failed", actor(request),
             len(report.created), len(report.updated), len(report.errors))
    return respond(ImportResult(created=report.created, updated=report.updated,
                                errors=report.errors))


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
                           bmc=bmc, bmc_password=password)


ROUTES: Final = (
    Route("POST", PATH, import_inventory,
          "Import expected machines (serial -> hostname, rack, profile, BMC) from CSV or JSON; "
          "a row that changes a known node's BMC needs the admin role, and a moved BMC its "
          "password",
          Role.OPERATOR, ImportResult, body=ImportDocument, text_bodies=(_CSV,),
          errors=(400, 413, 415, 422)),
)
