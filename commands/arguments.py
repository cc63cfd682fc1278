"""A command's arguments: validated from JSON by pydantic, built from the command's signature.

Each ``@command`` method gets a :class:`CommandArguments`: a pydantic ``TypeAdapter`` of a
``TypedDict`` whose keys are the method's parameters and whose value types are its type hints
(a parameter without a hint takes any JSON value, one with a default may be left out). It
validates in strict mode, as JSON: an ``int`` argument refuses ``"5"``, ``5.0`` and ``true``; a
``float`` one takes ``5``; a ``datetime``, ``UUID`` or ``Enum`` one takes its JSON string form;
lists, dicts, ``TypedDict``, dataclasses and pydantic models are checked all the way down. The
same adapter gives the JSON schema that ``GET /openapi.json`` publishes for the command.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, cast

from pydantic import ConfigDict, Field, PydanticSchemaGenerationError, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails
from typing_extensions import TypedDict  # pydantic needs it, not typing's, before 3.12

from foldstream.domain import Aggregate, commands_of
from foldstream.errors import ConfigurationError, FoldstreamError

_TYPED_DICT: Any = TypedDict  # called with a name and fields known only at run time
_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
#: json.dumps(arguments, allow_nan=False), by one encoder (json.dumps makes one per call).
_ARGUMENTS_JSON = json.JSONEncoder(allow_nan=False)


class InvalidArguments(FoldstreamError):
    """A command's arguments do not match its signature (HTTP 400).

    Remedy: send a JSON object whose keys and value types match the command's parameters
    (``GET /openapi.json`` has each command's JSON schema).
    """


@dataclass(frozen=True)
class CommandArguments:
    """How the JSON arguments of one command are checked: ``aggregate`` and ``command`` name
    it in URLs, ``signature`` is the method's (without ``self``), ``doc`` its docstring."""

    aggregate: str
    command: str
    signature: inspect.Signature
    adapter: TypeAdapter[dict[str, Any]]
    doc: str

    def bind(self, arguments: Any) -> dict[str, Any]:
        """The keyword arguments to call the command with, validated from ``arguments`` (a
        decoded JSON value); :class:`InvalidArguments` naming the argument that is wrong."""
        if not isinstance(arguments, dict):
            raise InvalidArguments(
                "the request body must be a JSON object of the command's arguments"
            )
        try:
            text = _ARGUMENTS_JSON.encode(arguments)
        except (TypeError, ValueError) as exc:
            raise InvalidArguments(f"the arguments are not JSON: {exc}") from None
        try:
            return self.adapter.validate_json(text)
        except ValidationError as exc:
            reasons = "; ".join(self._explain(error) for error in exc.errors(include_url=False))
            raise InvalidArguments(f"{reasons} (the command takes {self.signature})") from None

    def _explain(self, error: ErrorDetails) -> str:
        location = error["loc"]
        if not location:
            return error["msg"]
        name, inner = str(location[0]), "".join(f"[{part!r}]" for part in location[1:])
        kind = error["type"]
        if kind == "extra_forbidden":
            return f"unexpected argument {name!r}"
        if kind == "missing":
            return f"missing argument {name!r}"
        parameter = self.signature.parameters.get(name)
        hint = self._hints().get(name) if parameter is not None else None
        if not inner and kind.endswith("_type") and isinstance(hint, type):
            got = type(error["input"]).__name__
            return f"argument {name!r} must be {hint.__name__}, got {got}"
        return f"argument {name!r}{inner}: {error['msg']}"

    def _hints(self) -> dict[str, Any]:
        return {name: p.annotation for name, p in self.signature.parameters.items()}

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the command's arguments (a JSON object)."""
        return self.adapter.json_schema()


def arguments_of(aggregate: str, cls: type[Aggregate]) -> dict[str, CommandArguments]:
    """The :class:`CommandArguments` of each ``@command`` of ``cls`` (named ``aggregate``).

    Raises :class:`~foldstream.errors.ConfigurationError` for a command whose arguments cannot
    come from a JSON object (a positional-only parameter, a hint pydantic cannot validate).
    """
    found = {}
    for command, signature in commands_of(cls).items():
        method = getattr(cls, command)
        where = f"command {command!r} of aggregate {aggregate!r}"
        try:
            hints = typing.get_type_hints(method, include_extras=True)
        except Exception as exc:  # noqa: BLE001 - any failure to resolve a hint is the same error
            raise ConfigurationError(f"{where}: cannot resolve its type hints: {exc}") from exc
        resolved = signature.replace(
            return_annotation=inspect.Signature.empty,
            parameters=[
                p.replace(annotation=hints.get(p.name, p.annotation))
                for p in signature.parameters.values()
            ],
        )
        try:
            adapter = _adapter(f"{aggregate}.{command}", resolved)
        except (PydanticSchemaGenerationError, TypeError) as exc:
            raise ConfigurationError(
                f"{where}: its arguments cannot come from JSON: {exc}"
            ) from exc
        doc = inspect.getdoc(method) or ""
        found[command] = CommandArguments(aggregate, command, resolved, adapter, doc)
    return found


def command_arguments(
    aggregates: Mapping[str, type[Aggregate]],
) -> dict[str, dict[str, CommandArguments]]:
    """``{aggregate: {command: CommandArguments}}`` of a service's aggregates."""
    return {name: arguments_of(name, cls) for name, cls in aggregates.items()}


def _adapter(title: str, signature: inspect.Signature) -> TypeAdapter[dict[str, Any]]:
    fields: dict[str, Any] = {}
    extra: Literal["allow", "forbid"] = "forbid"
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if parameter.kind not in _KINDS:
            raise TypeError(f"parameter {parameter.name!r} is positional-only")
        hint = Any if parameter.annotation is inspect.Parameter.empty else parameter.annotation
        if parameter.default is inspect.Parameter.empty:
            fields[parameter.name] = hint
        else:
            fields[parameter.name] = NotRequired[Annotated[hint, _default(parameter.default)]]
    arguments = _TYPED_DICT(f"{title}.arguments", fields)
    arguments.__pydantic_config__ = ConfigDict(strict=True, extra=extra)
    return cast(TypeAdapter[dict[str, Any]], TypeAdapter(arguments))


def _default(value: Any) -> Any:
    """Shows a default in the schema when it is JSON (the command applies it, not pydantic)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return Field()
    return Field(json_schema_extra={"default": value})
