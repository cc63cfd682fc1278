"""The service template: bad names are rejected, and generated services pass their own tests.

``foldstream new`` bakes a service with a non-default name and its ``make test`` runs as a user
would (its own .venv, foldstream installed from this checkout, its own broker). The
``cookiecutter --no-input`` service is installed in that same .venv, loaded and collected.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from foldstream.broker import free_port
from foldstream.client import FoldstreamClient
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
    assert "make demo" in readme and "make test" in readme and "make serve" in readme
    assert "## Tutorial" in readme
    assert "serve: venv" in (ledger / "Makefile").read_text()
    assert "make test" in (ledger / ".github" / "workflows" / "ci.yml").read_text()
    assert os.access(ledger / "scripts" / "ensure-venv.sh", os.X_OK)
    cruft = json.loads((ledger / ".cruft.json").read_text())
    assert cruft["directory"] == "templates/service"
    assert cruft["context"]["cookiecutter"]["package_name"] == "warehouse_ledger"


def test_cruft_points_at_the_repository_of_a_git_foldstream_url(
    cookiecutter_config: Path, tmp_path: Path
) -> None:
    url = "git+https://git.example/acme/foldstream@v0.1.0"
    done = run(
        [sys.executable, "-m", "foldstream", "new", "Git Ledger", "--output-dir", str(tmp_path),
         "--foldstream-url", url],
        cwd=tmp_path,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, tail(done)
    service = tmp_path / "git-ledger"
    cruft = json.loads((service / ".cruft.json").read_text())
    assert cruft["template"] == "https://git.example/acme/foldstream"
    assert cruft["checkout"] == "v0.1.0"
    project = tomllib.loads((service / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == [f"foldstream @ {url}"]
    assert project["optional-dependencies"]["dev"][0] == f"foldstream[testing] @ {url}"


@pytest.fixture(scope="module")
def ledger_python(ledger: Path) -> str:
    """The ledger's own .venv (``make venv``: foldstream installed from this checkout)."""
    done = run(["make", "venv"], cwd=ledger, timeout=600)
    assert done.returncode == 0, tail(done)
    return str(ledger / ".venv" / "bin" / "python")


@pytest.mark.timeout(1000)  # above the subprocess's own bound, which reports its output
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


def test_make_serve_runs_an_instance_with_a_broker_beside_it(
    ledger: Path, ledger_python: str, tmp_path: Path
) -> None:
    port, broker_port = free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "KAFKA_BOOTSTRAP_SERVERS")
    }
    log = (tmp_path / "serve.log").open("wb")
    serving = subprocess.Popen(
        ["make", "serve", f"PORT={port}", f"BROKER_PORT={broker_port}",
         f"STATE_DIR={tmp_path / 'state'}"],
        cwd=ledger, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        instance = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while http_status(f"{instance}/ready") != 200:
            assert serving.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        with FoldstreamClient(instance, retry_timeout=60) as client:
            client.command("product", "sku-1", "receive_shipment", {"quantity": 5})
            deadline = time.monotonic() + 60
            while not client.get_many("stock", ["sku-1"]).values:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert client.get("stock", "sku-1") == {"on_hand": 5}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serving.pid, signal.SIGTERM)
        try:
            serving.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait()
        log.close()


def http_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return None


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh venv with foldstream installed from a wheel built from this checkout (its
    dependencies reached through a .pth file to this checkout's venv: no download of them)."""
    root = tmp_path_factory.mktemp("wheel")
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"),
         str(CHECKOUT)],
        cwd=root,
        timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, tail(built)
    (wheel,) = (root / "dist").glob("foldstream-*.whl")
    venv = root / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)], cwd=root, timeout=120).returncode == 0
    python = venv / "bin" / "python"
    installed = run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=root, timeout=300
    )
    assert installed.returncode == 0, tail(installed)
    site = run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], root, 60)
    ours = next(p for p in sys.path if p.endswith("site-packages"))
    Path(site.stdout.strip(), "zz-dependencies.pth").write_text(ours + "\n")
    return str(python)


def test_foldstream_new_works_from_an_installed_wheel(
    cookiecutter_config: Path, wheel_python: str, ledger: Path, tmp_path: Path
) -> None:
    where = run([wheel_python, "-c", "import foldstream; print(foldstream.__file__)"], tmp_path, 60)
    assert "site-packages" in where.stdout and str(CHECKOUT) not in where.stdout, tail(where)
    done = run(
        [wheel_python, "-m", "foldstream", "new", NAME, "--output-dir", str(tmp_path)],
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, tail(done)
    service = tmp_path / "warehouse-ledger"
    (requirement,) = tomllib.loads((service / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    assert requirement.startswith("foldstream @ file://") and requirement.endswith(".whl")

    # What the service's .gitignore leaves out (its venv, state, broker log) is made by running it.
    ignored = (ledger / ".gitignore").read_text().split()
    skip = tuple(line.strip("/").lstrip("*") for line in ignored if line.endswith("/"))

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and not any(part.endswith(skip) for part in p.relative_to(root).parts)
        }

    assert files(service) == files(ledger)
    for name in ("Makefile", "README.md", "domain/__init__.py", ".github/workflows/ci.yml"):
        assert (service / name).read_text() == (ledger / name).read_text(), name


def test_foldstream_new_says_what_to_install_without_cookiecutter(
    wheel_python: str, tmp_path: Path
) -> None:
    program = (
        "import sys; sys.modules['cookiecutter'] = None\n"
        "from foldstream.cli import main\n"
        "sys.argv = ['foldstream', 'new', 'Any Name']\n"
        "main()\n"
    )
    done = run([wheel_python, "-c", program], cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: foldstream new needs cookiecutter: pip install 'foldstream[template]'"
    )
