"""The route table and the OpenAPI 3.1 document built from it and the pydantic models.

Every route is declared once, as a ``Route``: ``app.py`` registers its handler, the auth
middleware reads its role, and this module describes it. The document cannot drift from
the routes it documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, Literal

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from provisioner.api.schemas import Problem
from provisioner.domain import Role

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Method = Literal["GET", "POST", "PATCH", "DELETE"]

_REF: Final = "#/components/schemas/{model}"
_Refs = Mapping[Any, dict[str, Any]]  # (model, mode) -> {"$ref": ...}
_PATH_PARAM: Final = re.compile(r"\{(\w+)\}")
_PROBLEM_MEDIA: Final = "application/problem+json"


@dataclass(frozen=True, slots=True)
class Route:
    method: Method
    path: str
    handler: Handler
    summary: str
    role: Role | None
    """The least role that may call it; None: no token needed."""
    response: type[BaseModel] | None = None
    """The body of the success response; None: ``media`` text."""
    status: int = 200
    media: str = "application/json"
    body: type[BaseModel] | None = None
    body_required: bool = True
    text_bodies: tuple[str, ...] = ()
    """Media types accepted as a raw text body besides JSON (``text/csv``)."""
    query: type[BaseModel] | None = None
    path_params: tuple[tuple[str, str], ...] = ()
    """(name, description) of each ``{name}`` in the path."""
    errors: tuple[int, ...] = ()
    """Error statuses besides 401/403 (added for routes with a role)."""


def openapi_document(routes: Sequence[Route], *, title: str, version: str) -> bytes:
    """The OpenAPI 3.1 document for ``routes``, as UTF-8 JSON."""
    keys: list[tuple[type[BaseModel], JsonSchemaMode]] = [(Problem, "serialization")]
    for route in routes:
        if route.body is not None:
            keys.append((route.body, "validation"))
        if route.response is not None:
            keys.append((route.response, "serialization"))
    refs, top = models_json_schema(keys, ref_template=_REF)
    components: dict[str, Any] = dict(top.get("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation = _operation(route, refs, components)
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    document = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    return json.dumps(document, indent=2, sort_keys=True).encode()


def _operation(route: Route, refs: _Refs, components: dict[str, Any]) -> dict[str, Any]:
    needs = f" Needs role `{route.role}`." if route.role else " No token needed."
    operation: dict[str, Any] = {
        "operationId": route.handler.__name__.strip("_"),
        "summary": route.summary,
        "description": route.summary + needs,
        "security": [{"bearer": []}] if route.role else [],
        "parameters": _parameters(route, components),
        "responses": _responses(route, refs),
    }
    if route.body is not None:
        content = {"application/json": {"schema": refs[route.body, "validation"]}}
        content |= {media: {"schema": {"type": "string"}} for media in route.text_bodies}
        operation["requestBody"] = {"required": route.body_required, "content": content}
    return operation


def _parameters(route: Route, components: dict[str, Any]) -> list[dict[str, Any]]:
    described = dict(route.path_params)
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"},
         "description": described.get(name, "")}
        for name in _PATH_PARAM.findall(route.path)
    ]
    if route.query is not None:
        schema = route.query.model_json_schema(ref_template=_REF)
        components.update(schema.get("$defs", {}))
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            params.append({"name": name, "in": "query", "required": name in required,
                           "schema": prop, "description": prop.get("description", "")})
    return params


def _responses(route: Route, refs: _Refs) -> dict[str, Any]:
    if route.response is not None:
        schema = refs[route.response, "serialization"]
    else:
        schema = {"type": "string" if route.media.startswith("text/") else "object"}
    responses: dict[str, Any] = {
        str(route.status): {"description": HTTPStatus(route.status).phrase,
                            "content": {route.media: {"schema": schema}}},
    }
    problem = {_PROBLEM_MEDIA: {"schema": refs[Problem, "serialization"]}}
    statuses = set(route.errors) | ({401, 403} if route.role else set())
    for status in sorted(statuses):
        responses[str(status)] = {"description": HTTPStatus(status).phrase, "content": problem}
    return responses
