"""The commands clients may send: ``POST /commands/{aggregate}/{id}/{command}``.

``AGGREGATES`` names each aggregate in URLs; its ``@command`` methods are the commands.
"""

from __future__ import annotations

from foldstream.domain import Aggregate

from {{ cookiecutter.package_name }}.domain import Product

AGGREGATES: dict[str, type[Aggregate]] = {"product": Product}
