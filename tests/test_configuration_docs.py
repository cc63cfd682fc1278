"""The configuration reference names every setting, flag and variable an instance reads."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import typer.main

from foldstream.cli import cli
from foldstream.http_input import InputLimits
from foldstream.settings import Settings

PAGE = (Path(__file__).parents[1] / "docs" / "reference" / "configuration.md").read_text()
SOURCES = [Path(__file__).parents[1] / d for d in ("foldstream", "commands", "projections")]


def test_every_flag_of_every_command_is_documented() -> None:
    group = typer.main.get_command(cli)
    commands = group.commands  # type: ignore[attr-defined]
    assert "serve" in commands
    missing = [
        f"{name} {opt}"
        for name, command in commands.items()
        for param in command.params
        if param.param_type_name == "option"
        for opt in [*param.opts, *param.secondary_opts]
        if f"`{opt}" not in PAGE and f"{opt}`" not in PAGE and f" {opt} " not in PAGE
    ]
    assert not missing, f"not in docs/reference/configuration.md: {missing}"


def test_every_environment_variable_read_is_documented() -> None:
    internal = {"FOLDSTREAM_PARENT_PID", "FOLDSTREAM_SERVE"}
    read = {
        name
        for root in SOURCES
        for path in root.rglob("*.py")
        for name in re.findall(r"FOLDSTREAM_[A-Z_]+[A-Z]", path.read_text())
    }
    read |= {f"FOLDSTREAM_{f.name.upper()}" for f in dataclasses.fields(InputLimits)}
    missing = sorted(read - internal - set(re.findall(r"FOLDSTREAM_[A-Z_]+", PAGE)))
    assert not missing, f"not in docs/reference/configuration.md: {missing}"


def test_every_setting_read_from_the_environment_is_documented() -> None:
    documented = set(re.findall(r"FOLDSTREAM_[A-Z_]+", PAGE))
    settable = {
        f"FOLDSTREAM_{field.name.upper()}"
        for field in dataclasses.fields(Settings)
        if f'("{field.name}",'
        in Path(__file__).parents[1].joinpath("foldstream", "settings.py").read_text()
    }
    assert settable and settable <= documented, sorted(settable - documented)
