"""One row per figure: its value, the reference measured beside it, their ratio and the target;
printed as a rich table and written as JSON."""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

_COMPARE: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le}


@dataclass
class Figure:
    """A measured figure. ``target`` is ``(">=" | "<=", bound)`` on ``ratio`` (value/reference)
    or, with ``absolute=True``, on ``value`` itself. ``value=None`` means not measured."""

    name: str
    value: float | None
    unit: str
    reference: float | None = None
    reference_name: str = ""
    target: tuple[str, float] | None = None
    absolute: bool = False
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    @property
    def status(self) -> str:
        if self.value is None:
            return "not measured"
        if self.target is None:
            return "info"
        checked = self.value if self.absolute else self.ratio
        if checked is None:
            return "no reference"
        op, bound = self.target
        return "pass" if _COMPARE[op](checked, bound) else "MISS"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "status": self.status}


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"
    return f"{text} {unit}".strip()


def _target(figure: Figure) -> str:
    if figure.target is None:
        return ""
    op, bound = figure.target
    return f"{op} {_number(bound, figure.unit)}" if figure.absolute else f"{op} {bound:g}×"


_STYLE = {"pass": "green", "MISS": "bold red", "not measured": "yellow"}


def print_table(console: Console, title: str, figures: list[Figure]) -> None:
    table = Table(title=title, show_lines=True)
    for column, justify in (
        ("figure", "left"),
        ("value", "right"),
        ("reference (same run)", "left"),
        ("ratio", "right"),
        ("target", "right"),
        ("", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for figure in figures:
        reference = (
            f"{_number(figure.reference, figure.unit)}: {figure.reference_name}"
            if figure.reference is not None
            else figure.reference_name
        )
        status = figure.status
        name = figure.name + (f"\n[dim]{figure.note}[/dim]" if figure.note else "")
        table.add_row(
            name,
            _number(figure.value, figure.unit),
            reference,
            "" if figure.ratio is None else f"{figure.ratio:.2f}×",
            _target(figure),
            f"[{_STYLE.get(status, '')}]{status}[/]" if status in _STYLE else status,
        )
    console.print(table)


def write_json(path: Path | None, run: dict[str, Any], figures: list[Figure]) -> Path:
    """Write the run to ``path`` (default ``bench/results/<timestamp>.json``); returns the path."""
    if path is None:
        path = Path(__file__).parent / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**run, "figures": [f.as_json() for f in figures]}, indent=2))
    return path
