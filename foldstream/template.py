"""``foldstream new``: a service generated from the cookiecutter template of this checkout.

The template lives beside the package (``cookiecutter.json`` and ``templates/service`` at the
repository root), so ``foldstream new`` works from a checkout or an editable install; elsewhere
pass ``template`` (a path or git URL of the foldstream repository).
"""

from __future__ import annotations

from pathlib import Path

from foldstream.errors import ConfigurationError

CHECKOUT = Path(__file__).resolve().parents[1]


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
    from cookiecutter.exceptions import CookiecutterException, FailedHookException
    from cookiecutter.main import cookiecutter

    if template is None:
        if not (CHECKOUT / "cookiecutter.json").is_file():
            raise ConfigurationError(
                f"no template beside this foldstream installation ({CHECKOUT}): pass "
                "--template with the path or git URL of the foldstream repository"
            )
        template = str(CHECKOUT)
    extra = {"service_name": name}
    if foldstream_url:
        extra["foldstream_url"] = foldstream_url
    try:
        created = cookiecutter(
            template, no_input=True, extra_context=extra, output_dir=str(output_dir)
        )
    except FailedHookException as exc:
        raise TemplateRejected(f"the template rejected {name!r} (reasons above)") from exc
    except CookiecutterException as exc:
        raise ConfigurationError(f"cannot create {name!r}: {exc}") from exc
    return Path(created)
