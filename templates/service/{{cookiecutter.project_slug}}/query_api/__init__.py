"""The service as served over HTTP: its commands and the stores its queries read.

``foldstream serve --service {{ cookiecutter.package_name }}.query_api:service`` runs it:
``GET /stores``, ``GET /stores/{store}/keys/{key}``, ``GET /health``, ``GET /ready`` and the
commands of :mod:`{{ cookiecutter.package_name }}.commands`.
"""

from __future__ import annotations

from foldstream.service import Service

from {{ cookiecutter.package_name }}.commands import AGGREGATES
from {{ cookiecutter.package_name }}.projections import PROJECTIONS

service = Service(
    name="{{ cookiecutter.project_slug }}",
    aggregates=AGGREGATES,
    projections=PROJECTIONS,
)
