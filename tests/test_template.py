"""The service template: bad names are rejected, and generated services pass their own tests.

``foldstream new`` bakes a service with a non-default name and its ``make test`` runs as a user
would (its own .venv, foldstream installed from this checkout, its own broker). The
``cookiecutter --no-input`` service is installed in that same .venv, loaded and collected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from foldstream.template import CHECKOUT

NAME = "Warehouse Ledger"


@pytest.fixture(scope="module")
def cookiecutter_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cookiecutter config whose replay and clone directories are temporary."""
    home = tmp_path_factory.mktemp("cookiecutter-home")
    config = home / "config.yaml"
    config.write_text(f"cookiecutters_dir: {home / 'clones'}\nreplay_dir: {home / 'replay'}\n")
    previous = os.environ.get("COOKIECUTTER_CONFIG")
    os.environ["COOKIECUTTER_CONFIG"] = str(config)
    yield config
    if previous is None:
        del os.environ["COOKIECUTTER_CONFIG"]
    else:
        os.environ["COOKIECUTTER_CONFIG"] = previous


def run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def tail(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{(done.stdout + done.stderr)[-6000:]}"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("123 Sys", "service name '123 Sys'"),
        ("Sys", "would shadow the module"),
        ("Import", "not a Python keyword"),
        ("Foldstream", "would shadow the module"),
        ("Stock/Ledger", "service name 'Stock/Ledger'"),
    ],
)
def test_hook_rejects_bad_names_and_writes_nothing(
    cookiecutter_config: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    name: str,
    reason: str,
) -> None:
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(CHECKOUT),
            no_input=True,
            extra_context={"service_name": name},
            output_dir=str(tmp_path),
        )
    assert reason in capfd.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_foldstream_new_rejects_a_bad_name_with_the_hooks_message(
    cookiecutter_config: Path, tmp_path: Path
) -> None:
    done = run(
        [sys.executable, "-m", "foldstream", "new", "9 Lives", "--output-dir", str(tmp_path)],
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2, tail(done)
    assert "error: service name '9 Lives'" in done.stderr
    assert "the template rejected '9 Lives'" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def ledger(cookiecutter_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``foldstream new "Warehouse Ledger"``: the service directory."""
    out = tmp_path_factory.mktemp("new")
    done = run(
        [sys.executable, "-m", "foldstream", "new", NAME, "--output-dir", str(out)],
        cwd=out,
        timeout=60,
    )
    assert done.returncode == 0, tail(done)
    return out / "warehouse-ledger"


def test_generated_service_has_the_cards_shape_and_depends_on_foldstream(ledger: Path) -> None:
    for layer in ("domain", "commands", "projections", "query_api", "features"):
        assert (ledger / layer).is_dir(), layer
    assert not (ledger / "foldstream").exists()
    project = tomllib.loads((ledger / "pyproject.toml").read_text())["project"]
    assert project["name"] == "warehouse-ledger"
    assert project["dependencies"] == [f"foldstream @ {CHECKOUT.as_uri()}"]
    readme = (ledger / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    cruft = json.loads((ledger / ".cruft.json").read_text())
    assert cruft["template"] == str(CHECKOUT)
    assert cruft["directory"] == "templates/service"
    assert cruft["context"]["cookiecutter"]["package_name"] == "warehouse_ledger"


@pytest.fixture(scope="module")
def ledger_python(ledger: Path) -> str:
    """The ledger's own .venv (``make venv``: foldstream installed from this checkout)."""
    done = run(["make", "venv"], cwd=ledger, timeout=600)
    assert done.returncode == 0, tail(done)
    return str(ledger / ".venv" / "bin" / "python")


def test_generated_service_passes_its_own_make_test(ledger: Path, ledger_python: str) -> None:
    done = run(["make", "test"], cwd=ledger, timeout=900)
    assert done.returncode == 0, tail(done)
    assert " passed" in done.stdout and "failed" not in done.stdout, tail(done)


def test_no_input_service_loads_and_collects_its_features(
    cookiecutter_config: Path, tmp_path: Path, ledger_python: str
) -> None:
    """``cookiecutter --no-input <repo>``: the default answers make a service that installs,
    loads and collects its features (in the ledger's .venv: a second foldstream install and
    Spark start would double this test's time; the ledger's run covers the same files)."""
    done = run(
        [sys.executable, "-m", "cookiecutter", "--no-input", str(CHECKOUT)],
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, tail(done)
    service = tmp_path / "retail-inventory"
    pip = [ledger_python, "-m", "pip", "install", "-q", "--no-deps", "-e", "."]
    installed = run(pip, cwd=service, timeout=300)
    assert installed.returncode == 0, tail(installed)
    load = "import sys, foldstream.service as s; print(s.load_service(sys.argv[1]).name)"
    loaded = run([ledger_python, "-c", load, "retail_inventory.query_api:service"], tmp_path, 60)
    assert loaded.stdout.strip() == "retail-inventory", tail(loaded)
    collected = run(
        [ledger_python, "-m", "pytest", "--collect-only", "-q"], cwd=service, timeout=120
    )
    assert collected.returncode == 0, tail(collected)
    assert "4 tests collected" in collected.stdout, tail(collected)
