"""The reference beside the range figure: the least a Starlette + uvicorn app does to answer
``GET /stores/{store}/keys/{key}/range?limit=N`` from an ordered store's RocksDB partitions
(opened read-only with the options they were written with): one seek and ``limit + 1`` steps
of a rocksdict iterator, the same body as the instance's (sort key as ISO-8601, stored value as
it is, the next page's cursor), without routing, limits or ``served_by``.

    python -m bench.servers minimal-range --state-dir DIR --store S --partitions N ...
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from rocksdict import ReadOptions
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.servers import open_read_only
from foldstream.kafka import Partitioner, partition_for
from foldstream.state.format import ORDERED_FORMAT
from foldstream.state.ordered_keys import decode_int, entry_prefix, prefix_end
from foldstream.times import iso_ms


def minimal_range_app(
    state_dir: Path, store: str, partitions: int, partitioner: Partitioner
) -> Starlette:
    """Ranges of a time-ordered store (entries: sort key + source offset), nothing else."""
    dbs = open_read_only(state_dir, store, partitions, ORDERED_FORMAT)

    async def get_range(request: Request) -> Response:
        key = request.path_params["key"].encode()
        limit = int(request.query_params.get("limit", "100"))
        prefix = entry_prefix(key)
        bounds = ReadOptions()
        bounds.set_iterate_upper_bound(prefix_end(prefix))
        entries = dbs[partition_for(key, partitions, partitioner)].iter(bounds)
        entries.seek(prefix)
        found: list[tuple[bytes, bytes]] = []
        while len(found) <= limit and entries.valid():
            found.append((entries.key(), entries.value()))
            entries.next()
        cut = len(prefix)
        items = [
            b'{"sort_key":"%s","value":%s}' % (iso_ms(decode_int(k[cut : cut + 8])).encode(), v)
            for k, v in found[:limit]
        ]
        after = b"null"
        if len(found) > limit:
            cursor = base64.urlsafe_b64encode(found[limit - 1][0][cut:]).rstrip(b"=")
            after = b'"%s"' % cursor
        body = b'{"key":%s,"entries":[%s],"next":%s}' % (
            json.dumps(key.decode()).encode(),
            b",".join(items),
            after,
        )
        return Response(body, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"alive"}', media_type="application/json")

    return Starlette(
        routes=[
            Route(f"/stores/{store}/keys/{{key}}/range", get_range),
            Route("/health", health),
        ]
    )
