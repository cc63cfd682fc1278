"""``GET /openapi.json``: the OpenAPI 3.1 description of a service's HTTP API, built from it.

Each command of each aggregate is a path of its own (``POST /commands/product/{id}/sell``) whose
request body is the JSON schema of the command's arguments, the one that validates them
(:mod:`foldstream.commands.arguments`); each store has the reads of its kind (lookup and batch
of a point store, range of an ordered one, windows of a windowed one) and its owners path; the
answers' schemas are those of :mod:`foldstream.api_models`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from foldstream import api_models as models
from foldstream.commands.arguments import CommandArguments
from foldstream.commands.idempotency import IDEMPOTENCY_PARAMETER
from foldstream.http_input import InputLimits
from foldstream.projections.projection import Projection
from foldstream.query_api.range_answers import DEFAULT_LIMIT, MAX_LIMIT
from foldstream.query_api.stores import sort_key_of
from foldstream.route_params import (
    BATCH,
    CLUSTER,
    COMMAND,
    HEALTH,
    LOOKUP,
    METRICS,
    OWNERS,
    RANGE_READ,
    READY,
    REBUILD,
    STORES,
    WINDOWS_READ,
    RouteParams,
)

REF = "#/components/schemas/{model}"


class StoreReads(NamedTuple):
    """What a store answers: its ``kind`` (point, ordered or windowed) and, for an ordered or
    windowed store, the type of its sort keys (``time``, ``int`` or ``string``)."""

    kind: str = "point"
    sort_key: str | None = None


def store_reads(projection: Projection) -> StoreReads:
    """What ``projection``'s store answers, as the query API reads it
    (:class:`~foldstream.query_api.stores.StoreInfo`)."""
    return StoreReads(projection.kind, sort_key_of(projection))


#: How a range's ``from`` and ``to`` are given, by the sort keys' type.
_BOUNDS = {
    "time": "an ISO-8601 time (a '+' in its offset sent as %2B; no offset: UTC) or epoch "
    "milliseconds",
    "int": "an integer",
    "string": "a string",
}
ANSWER_MODELS: tuple[type[BaseModel], ...] = (
    models.ErrorAnswer,
    models.VersionConflictAnswer,
    models.LookupAnswer,
    models.MissingKeyAnswer,
    models.BatchAnswer,
    models.RangeAnswer,
    models.WindowsAnswer,
    models.CommandAnswer,
    models.StoresAnswer,
    models.RebuildAnswer,
    models.OwnersAnswer,
    models.ClusterMap,
    models.Readiness,
)
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
_LOCATION = {"Location": {"schema": {"type": "string"}, "description": "the owner's URL"}}
_REPLAYED = {"Idempotent-Replayed": {"schema": {"const": "true"}, "description": "a retry"}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _json(schema: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    content = {"application/json": {"schema": schema}}
    return {"description": description, "content": content, **extra}


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return _json(_ref("ErrorAnswer"), description, **extra)


_REDIRECT = {"description": "another instance answers: same request there", "headers": _LOCATION}
_UNAVAILABLE = _error("nobody can answer right now (rebalancing, restoring)", headers=_RETRY_AFTER)


def openapi_document(
    *,
    title: str,
    version: str,
    commands: Mapping[str, Mapping[str, CommandArguments]],
    stores: Mapping[str, StoreReads],
    limits: InputLimits,
    commands_secured: bool,
    queries_secured: bool,
) -> dict[str, Any]:
    """The OpenAPI document of a service named ``title``: its ``commands`` (``{aggregate:
    {command: arguments}}``) and ``stores`` (what each answers). ``*_secured``: whether those
    paths need a bearer token (:mod:`foldstream.auth`)."""
    inputs: list[tuple[str, JsonSchemaMode, TypeAdapter[Any]]]
    inputs = [(m.__name__, "serialization", TypeAdapter(m)) for m in ANSWER_MODELS]
    _, definitions = TypeAdapter.json_schemas(inputs, ref_template=REF)
    components = dict(definitions.get("$defs", {}))
    for by_name in commands.values():
        for spec in by_name.values():
            schema = spec.adapter.json_schema(ref_template=REF)
            components.update(schema.pop("$defs", {}))  # the types its arguments use
            components[_schema_name(spec)] = schema
    paths: dict[str, Any] = {}
    bearer: list[Any] = [{"bearer": []}]
    command_security = bearer if commands_secured else None
    query_security = bearer if queries_secured else None
    for by_name in commands.values():
        for spec in by_name.values():
            paths[_command_path(spec)] = {"post": _command_operation(spec, command_security)}
    for store, reads in stores.items():
        paths.update(_store_paths(store, reads, limits, query_security))
    paths.update(_instance_paths(query_security))
    paths["/stores/{store}/rebuilds"] = {"post": _rebuild_operation(command_security)}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "Commands append events to Kafka; stores answer lookups. A request "
            "reaching an instance that does not own the key's partition is redirected (307) to "
            "the owner; 503 with Retry-After while nobody can answer.",
        },
        "paths": paths,
        "components": {"schemas": components},
    }
    if commands_secured or queries_secured:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return document


def _schema_name(spec: CommandArguments) -> str:
    return f"{spec.aggregate}.{spec.command}.arguments"


def _command_path(spec: CommandArguments) -> str:
    return f"/commands/{spec.aggregate}/{{id}}/{spec.command}"


def _command_operation(spec: CommandArguments, security: list[Any] | None) -> dict[str, Any]:
    required = bool(spec.json_schema().get("required"))
    # Docstrings are reStructuredText; OpenAPI renders Markdown: ``code`` becomes `code`.
    summary, _, details = spec.doc.replace("``", "`").partition("\n\n")
    operation: dict[str, Any] = {
        "operationId": f"{spec.aggregate}.{spec.command}",
        "tags": [f"commands: {spec.aggregate}"],
        "summary": summary.replace("\n", " ") or f"{spec.command} on a {spec.aggregate}",
        "description": details,
        "parameters": [
            {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
            *COMMAND.openapi(),
            {
                "name": "If-Match",
                "in": "header",
                "description": "the expected version, as a header",
                "schema": {"type": "string"},
            },
            IDEMPOTENCY_PARAMETER,
        ],
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": _ref(_schema_name(spec))}},
        },
        "responses": {
            "200": _json(_ref("CommandAnswer"), "appended (or was: a retry)", headers=_REPLAYED),
            "307": _REDIRECT,
            "400": _error(
                "malformed JSON, arguments not matching, bad expected_version or key, a query "
                "parameter the route does not take"
            ),
            "404": _error("unknown aggregate or command"),
            "409": _json(_ref("VersionConflictAnswer"), "not at expected_version"),
            "413": _error("body or event too large"),
            "422": _error("the command broke a domain rule, or its key named another request"),
            "503": _error(
                "not the owner yet, or Kafka failed (the body says whether the outcome is "
                "unknown: resend with the same Idempotency-Key)",
                headers=_RETRY_AFTER,
            ),
        },
    }
    if security is not None:
        operation["security"] = security
        operation["responses"]["401"] = _error("credentials missing or refused")
    return operation


def _store_paths(
    store: str, reads: StoreReads, limits: InputLimits, security: list[Any] | None
) -> dict[str, Any]:
    """The paths of ``store``: the reads of its kind, and its owners."""
    tag = [f"store: {store}"]
    owners = {
        "operationId": f"{store}.owners",
        "tags": tag,
        "summary": f"Which instances answer for a key of {store}",
        "parameters": [_key_param(limits), *OWNERS.openapi()],
        "responses": {
            "200": _json(_ref("OwnersAnswer"), "the partition and its copies"),
            "400": _error(_BAD_PARAMETER),
        },
    }
    if reads.kind == "point":
        paths = _lookup_paths(store, limits)
    else:
        paths = _range_paths(store, reads, limits)
    paths[f"/stores/{store}/owners/{{key}}"] = {"get": owners}
    for methods in paths.values():
        for operation in methods.values():
            operation["tags"] = tag
            if security is not None:
                operation["security"] = security
    return paths


def _rebuild_operation(security: list[Any] | None) -> dict[str, Any]:
    """``POST /stores/{store}/rebuilds``, secured as commands are."""
    operation: dict[str, Any] = {
        "operationId": "rebuild",
        "tags": ["instance"],
        "summary": "Rebuild the version of a store that answers, beside it (docs/concepts/"
        "versions.md)",
        "parameters": [
            {"name": "store", "in": "path", "required": True, "schema": {"type": "string"}},
            *REBUILD.openapi(),
        ],
        "responses": {
            "202": _json(_ref("RebuildAnswer"), "every instance builds the new generation"),
            "400": _error("a malformed store name, a body, or a query parameter"),
            "404": _error("no such store"),
            "409": _error("a newer version or a rebuild is being built already"),
            "422": _error("the store cannot be rebuilt beside itself; the error names the remedy"),
        },
    }
    if security is not None:
        operation["security"] = security
        operation["responses"]["401"] = _error("credentials missing or refused")
    return operation


def _key_param(limits: InputLimits) -> dict[str, Any]:
    return {
        "name": "key",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "maxLength": limits.max_key_bytes},
    }


def _bound_schema(sort_key: str | None) -> dict[str, Any]:
    if sort_key == "int":
        return {"type": "integer"}
    if sort_key == "time":
        return {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "integer"}]}
    return {"type": "string"}


_BAD_PARAMETER = "a query parameter the route does not take (the error names it)"


def _read_responses(answer: str, description: str, missing: dict[str, Any]) -> dict[str, Any]:
    """The answers of a read routed to a key's owner (``missing``: its 404)."""
    return {
        "200": _json(_ref(answer), description),
        "307": _REDIRECT,
        "400": _error("bad key or parameter, or a parameter the route does not take"),
        "404": missing,
        "414": _error("URL too long"),
        "503": _UNAVAILABLE,
    }


def _lookup_paths(store: str, limits: InputLimits) -> dict[str, Any]:
    """A point store's lookup and batch lookup."""
    lookup = {
        "operationId": f"{store}.lookup",
        "summary": f"The value of a key in {store}",
        "parameters": [_key_param(limits), *LOOKUP.openapi()],
        "responses": _read_responses(
            "LookupAnswer",
            "the value and who served it",
            _json(_ref("MissingKeyAnswer"), "no such key (or store)"),
        ),
    }
    keys = {"type": "array", "items": {"type": "string"}, "maxItems": limits.max_batch_keys}
    batch = {
        "operationId": f"{store}.batch",
        "summary": f"The values of many keys in {store}",
        "parameters": BATCH.openapi(),
        "requestBody": {"required": True, "content": {"application/json": {"schema": keys}}},
        "responses": {
            "200": _json(_ref("BatchAnswer"), "values here; keys owned elsewhere by owner URL"),
            "400": _error("not a JSON list of keys, or a query parameter the route does not take"),
            "404": _error("no such store"),
            "413": _error("body too large"),
        },
    }
    return {
        f"/stores/{store}/keys/{{key}}": {"get": lookup},
        f"/stores/{store}/keys": {"post": batch},
    }


def _range_paths(store: str, reads: StoreReads, limits: InputLimits) -> dict[str, Any]:
    """An ordered store's range read, or a windowed store's windows read."""
    windows = reads.kind == "windowed"
    name = "windows" if windows else "range"
    what = "windows whose start is" if windows else "entries whose sort key is"
    bound = _BOUNDS[reads.sort_key or "time"]
    page = {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_LIMIT,
        "default": MAX_LIMIT if windows else DEFAULT_LIMIT,
    }
    declared = WINDOWS_READ if windows else RANGE_READ
    own: dict[str, dict[str, Any]] = {
        "from": {"description": f"inclusive: {bound}", "schema": _bound_schema(reads.sort_key)},
        "to": {"description": f"exclusive: {bound}", "schema": _bound_schema(reads.sort_key)},
        "limit": {"schema": page},
    }
    read = {
        "operationId": f"{store}.{name}",
        "summary": f"A key's {what} in [from, to) in {store}",
        "parameters": [_key_param(limits), *declared.openapi(**own)],
        "responses": _read_responses(
            "WindowsAnswer" if windows else "RangeAnswer",
            f"a page of the key's {name if windows else 'entries'} (a key without any: empty)",
            _error("no such store"),
        ),
    }
    return {f"/stores/{store}/keys/{{key}}/{name}": {"get": read}}


def _instance_paths(security: list[Any] | None) -> dict[str, Any]:
    def get(
        name: str, summary: str, answer: dict[str, Any], params: RouteParams, open_: bool = False
    ) -> Any:
        operation: dict[str, Any] = {"operationId": name, "tags": ["instance"], "summary": summary}
        operation["parameters"] = params.openapi()
        operation["responses"] = {**answer, "400": _error(_BAD_PARAMETER)}
        if security is not None and not open_:
            operation["security"] = security
        return {"get": operation}

    text = {"content": {"text/plain": {"schema": {"type": "string"}}}}
    return {
        "/stores": get(
            "stores", "The stores", {"200": _json(_ref("StoresAnswer"), "stores")}, STORES
        ),
        "/cluster": get(
            "cluster",
            "The cluster map: members, owners and standbys of every partition",
            {"200": _json(_ref("ClusterMap"), "the map")},
            CLUSTER,
        ),
        "/health": get(
            "health", "Alive", {"200": _json({"type": "object"}, "alive")}, HEALTH, open_=True
        ),
        "/ready": get(
            "ready",
            "Serving everything it owns, caught up",
            {
                "200": _json(_ref("Readiness"), "ready"),
                "503": _json(_ref("Readiness"), "not ready, and why"),
            },
            READY,
            open_=True,
        ),
        "/metrics": get(
            "metrics",
            "Prometheus metrics",
            {"200": {"description": "Prometheus' text format", **text}},
            METRICS,
            open_=True,
        ),
    }
