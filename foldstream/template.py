"""``foldstream new``: a service generated from the cookiecutter template foldstream ships.

The template is ``templates/service`` in the foldstream repository, installed inside the package
as ``foldstream/templates/service``: ``foldstream new`` works from a checkout, an editable
install and an installed wheel alike (with ``pip install 'foldstream[template]'`` for
cookiecutter). ``template`` (a path or git URL) takes another one.
"""

from __future__ import annotations

from pathlib import Path

from foldstream.errors import ConfigurationError, EnvironmentNotReady

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent


def template_directory() -> Path:
    """The service template: the checkout's, else the one installed with the package."""
    for candidate in (CHECKOUT / "templates" / "service", PACKAGE / "templates" / "service"):
        if (candidate / "cookiecutter.json").is_file():
            return candidate
    raise ConfigurationError(
        f"no service template in this foldstream installation ({PACKAGE}): reinstall it, or "
        "pass --template with the path or git URL of the foldstream repository"
    )


class TemplateRejected(ConfigurationError):
    """The template's ``pre_gen_project`` hook rejected the answers (its message says why).

    Remedy: choose a service name made of letters, digits and spaces that starts with a letter
    and whose package does not shadow a module (e.g. ``foldstream new "Warehouse Ledger"``).
    """


def new_service(
    name: str,
    *,
    output_dir: Path = Path("."),
    foldstream_url: str | None = None,
    template: str | None = None,
) -> Path:
    """Generate the service named ``name`` under ``output_dir``; returns its directory."""
    try:
        from cookiecutter.exceptions import CookiecutterException, FailedHookException
        from cookiecutter.main import cookiecutter
    except ImportError:
        raise EnvironmentNotReady(
            "foldstream new needs cookiecutter: pip install 'foldstream[template]'"
        ) from None
    extra = {"service_name": name}
    if foldstream_url is not None:
        extra["foldstream_url"] = foldstream_url
    try:
        created = cookiecutter(
            template or str(template_directory()),
            no_input=True,
            extra_context=extra,
            output_dir=str(output_dir),
        )
    except FailedHookException as exc:
        raise TemplateRejected(f"the template rejected {name!r} (reasons above)") from exc
    except CookiecutterException as exc:
        raise ConfigurationError(f"cannot create {name!r}: {exc}") from exc
    return Path(created)
