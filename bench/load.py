"""HTTP load from a separate process: Debian's ``wrk`` (installed on demand when root), or a
Python (aiohttp) generator in a child process when wrk cannot be had.

A :class:`Load` names its request: ``path`` with ``{key}`` replaced by a random key, and for a
batch a JSON list of ``batch`` random keys as the body.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

from rich.console import Console


@dataclass(frozen=True)
class Load:
    """What to send: ``method`` ``path`` (``{key}`` → a random one of ``keys`` keys formatted with
    ``key_format``), with ``body``, or (``batch`` > 0) a JSON list of ``batch`` random keys."""

    method: str
    path: str
    keys: int
    key_format: str = "sku-%07d"
    body: str | None = None
    batch: int = 0

    def key(self, rng: random.Random) -> str:
        return self.key_format % rng.randrange(self.keys)

    def lua(self) -> str:
        head, _, tail = self.path.partition("{key}")
        path = json.dumps(head) + (
            f" .. string.format({json.dumps(self.key_format)}, math.random(0, {self.keys - 1}))"
            f" .. {json.dumps(tail)}"
            if "{key}" in self.path
            else ""
        )
        if self.batch:
            body = (
                "local t = {}\n"
                f"  for i = 1, {self.batch} do t[i] = string.format('\"{self.key_format}\"',"
                f" math.random(0, {self.keys - 1})) end\n"
                '  local body = "[" .. table.concat(t, ",") .. "]"'
            )
        else:
            body = f"local body = {json.dumps(self.body) if self.body is not None else 'nil'}"
        return f"""
math.randomseed(os.time())
request = function()
  {body}
  return wrk.format("{self.method}", {path}, {{["Content-Type"] = "application/json"}}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH {{\\"requests\\":%d,\\"seconds\\":%f,\\"errors\\":%d,"
    .. "\\"non_2xx\\":%d,\\"p50_ms\\":%f,\\"p99_ms\\":%f}}\\n", summary.requests,
    summary.duration / 1e6, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


@dataclass(frozen=True)
class LoadResult:
    requests: int
    seconds: float
    errors: int
    non_2xx: int
    p50_ms: float
    p99_ms: float
    tool: str


def wrk_binary(console: Console) -> str | None:
    """``wrk``, installed with apt-get when missing and running as root; None otherwise."""
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        if not found:
            console.print("[yellow]wrk not found (install it: apt-get install wrk); "
                          "using the slower Python load generator")  # fmt: skip
        return found
    with console.status("installing wrk (apt-get install -y wrk)"):
        for command in (["apt-get", "install", "-y", "wrk"], ["apt-get", "update"],
                        ["apt-get", "install", "-y", "wrk"]):  # fmt: skip
            done = subprocess.run(command, capture_output=True, check=False)
            if command[1] == "install" and done.returncode == 0:
                break
    return shutil.which("wrk")


def run_load(
    wrk: str | None, url: str, load: Load, *, seconds: float, connections: int
) -> LoadResult:
    """Send ``load`` to ``url`` for ``seconds`` over ``connections`` keep-alive connections."""
    if wrk is None:
        return _python_load(url, load, seconds, connections)
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(load.lua())
        script.flush()
        done = subprocess.run(
            [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", script.name, url],
            capture_output=True,
            text=True,
            check=True,
        )
    line = next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))
    return LoadResult(**json.loads(line[len("BENCH ") :]), tool="wrk")


def _python_load(url: str, load: Load, seconds: float, connections: int) -> LoadResult:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_python_load_child, (url, load, seconds, connections))


def _python_load_child(url: str, load: Load, seconds: float, connections: int) -> LoadResult:
    import aiohttp

    async def run() -> LoadResult:
        rng = random.Random()
        latencies: list[float] = []
        errors = non_2xx = 0
        deadline = time.perf_counter() + seconds

        async def worker(session: aiohttp.ClientSession) -> None:
            nonlocal errors, non_2xx
            while time.perf_counter() < deadline:
                path = load.path.replace("{key}", load.key(rng))
                body = (
                    json.dumps([load.key(rng) for _ in range(load.batch)])
                    if load.batch
                    else load.body
                )
                sent = time.perf_counter()
                try:
                    async with session.request(load.method, url + path, data=body) as response:
                        await response.read()
                        non_2xx += not 200 <= response.status < 400
                except aiohttp.ClientError:
                    errors += 1
                latencies.append(time.perf_counter() - sent)

        started = time.perf_counter()
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(worker(session) for _ in range(connections)))
        latencies.sort()
        return LoadResult(
            requests=len(latencies),
            seconds=time.perf_counter() - started,
            errors=errors,
            non_2xx=non_2xx,
            p50_ms=latencies[len(latencies) // 2] * 1e3,
            p99_ms=latencies[int(len(latencies) * 0.99)] * 1e3,
            tool="python (aiohttp)",
        )

    return asyncio.run(run())
