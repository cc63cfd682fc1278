"""Hostile HTTP input against a real instance (broker, Spark, RocksDB, uvicorn with the lookup
protocol): every request gets a 4xx, and after each one fresh commands and lookups on every
partition still work. Then property-based fuzzing of every endpoint: zero 5xx."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.parse
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldstream.kafka import partition_for
from foldstream.process import InstanceProcess, http
from foldstream.testing.plugin import InstancePool
from foldstream.testing.steps import wait_until

Answer = tuple[int, dict[bytes, bytes], bytes]


@pytest.fixture(scope="module")
def running(instances: InstancePool, foldstream_service: str) -> InstanceProcess:
    return instances.get(foldstream_service)


def exchange(url: str, request: bytes, timeout: float = 30) -> Answer:
    """Send ``request`` as it is; the status, headers and body of the answer."""
    address = urllib.parse.urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # answered and closed before all was sent
            sock.sendall(request)
        reader = sock.makefile("rb")
        status = int(reader.readline().split()[1])
        headers = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.rstrip(b"\r\n").partition(b": ")
            headers[name.lower()] = value
        length = 0 if request.startswith(b"HEAD ") else int(headers.get(b"content-length", b"0"))
        body = reader.read(length)
    return status, headers, body


def request(
    method: str,
    target: str | bytes,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> bytes:
    target = target if isinstance(target, bytes) else target.encode()
    head = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1"]
    head += [f"{k}: {v}".encode("latin-1") for k, v in (headers or {}).items()]
    if body is not None and "Transfer-Encoding" not in (headers or {}):
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + (body or b"")


def chunked(body: bytes, size: int = 65536) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def key_in(partition: int, partitions: int) -> str:
    return next(
        key
        for key in (f"fresh-{uuid.uuid4().hex[:12]}" for _ in range(1000))
        if partition_for(key.encode(), partitions) == partition
    )


def every_partition_works(instance: InstanceProcess) -> None:
    """A fresh command on each partition is accepted, and its value becomes visible through
    a lookup and a batch lookup."""
    keys = [key_in(p, instance.partitions) for p in range(instance.partitions)]
    for key in keys:
        status, body = http(
            "POST", f"{instance.url}/commands/product/{key}/receive_shipment", {"quantity": 2}
        )
        assert status == 200, body

    def visible() -> bool:
        found = [http("GET", f"{instance.url}/stores/stock/keys/{key}") for key in keys]
        batch = http("POST", f"{instance.url}/stores/stock/keys", keys)
        return all(s == 200 and b["value"] == {"on_hand": 2} for s, b in found) and batch[1][
            "values"
        ] == dict.fromkeys(keys, {"on_hand": 2})

    wait_until(visible, lambda: f"fresh commands on every partition not visible: {keys}")


_NESTED = b"[" * 100_000 + b"]" * 100_000
_HUGE = "h" * 1_100_000
_DIGITS = "9" * 5000
_COMMAND = "/commands/product/hostile-1/receive_shipment"

HOSTILE: list[tuple[str, bytes, int]] = [
    ("1.1 MB aggregate id", request("POST", f"/commands/product/{_HUGE}/sell", b"{}"), 414),
    ("1.1 MB lookup key", request("GET", f"/stores/stock/keys/{_HUGE}"), 414),
    ("5000-byte aggregate id", request("POST", f"/commands/product/{'i' * 5000}/sell", b"{}"), 400),
    ("5000-byte key", request("GET", f"/stores/stock/keys/{'k' * 5000}"), 400),
    ("300-byte command name", request("POST", f"/commands/product/x/{'c' * 300}", b"{}"), 400),
    ("300-byte store name", request("GET", f"/stores/{'s' * 300}/keys/x"), 400),
    ("%FF key", request("GET", "/stores/stock/keys/a%FF"), 400),
    ("%FE key", request("GET", "/stores/stock/keys/a%FE"), 400),
    ("%FF owners key", request("GET", "/stores/stock/owners/a%FF"), 400),
    ("%FF aggregate id", request("POST", "/commands/product/a%FF/sell", b"{}"), 400),
    ("%FF store", request("POST", "/stores/%FF/keys", b'["a"]'), 400),
    ("5000-digit max_lag", request("GET", f"/stores/stock/keys/x?max_lag={_DIGITS}"), 400),
    ("5000-digit hops", request("GET", f"/stores/stock/keys/x?hops={_DIGITS}"), 400),
    ("5000-digit command hops", request("POST", f"{_COMMAND}?hops={_DIGITS}", b"{}"), 400),
    (
        "5000-digit expected_version",
        request("POST", f"{_COMMAND}?expected_version={_DIGITS}", b'{"quantity": 1}'),
        400,
    ),
    (
        "5000-digit If-Match",
        request("POST", _COMMAND, b'{"quantity": 1}', {"If-Match": _DIGITS}),
        400,
    ),
    (
        "5000-byte Idempotency-Key",
        request("POST", _COMMAND, b'{"quantity": 1}', {"Idempotency-Key": "k" * 5000}),
        400,
    ),
    (
        "Idempotency-Key of Latin-1 bytes",
        request("POST", _COMMAND, b'{"quantity": 1}', {"Idempotency-Key": "k\xff\xe9"}),
        400,
    ),
    ("command JSON nested 100k deep", request("POST", _COMMAND, b'{"q": ' + _NESTED + b"}"), 400),
    ("batch JSON nested 100k deep", request("POST", "/stores/stock/keys", _NESTED), 400),
    (
        "5000-digit argument",
        request("POST", _COMMAND, b'{"quantity": ' + _DIGITS.encode() + b"}"),
        400,
    ),
    ("argument above 2**63", request("POST", _COMMAND, b'{"quantity": 9223372036854775808}'), 400),
    ("NaN argument", request("POST", _COMMAND, b'{"quantity": NaN}'), 400),
    ("2 MB command body", request("POST", _COMMAND, b" " * 2_000_000), 413),
    (
        "2 MB chunked command body",
        request("POST", _COMMAND, chunked(b" " * 2_000_000), {"Transfer-Encoding": "chunked"}),
        413,
    ),
    ("2 MB batch body", request("POST", "/stores/stock/keys", b" " * 2_000_000), 413),
    (
        "2 MB chunked batch body",
        request(
            "POST",
            "/stores/stock/keys",
            chunked(b" " * 2_000_000),
            {"Transfer-Encoding": "chunked"},
        ),
        413,
    ),
    (
        "20k keys in a batch",
        request(
            "POST", "/stores/stock/keys", json.dumps([f"k{n}" for n in range(20_000)]).encode()
        ),
        400,
    ),
    (
        "5000-byte batch key",
        request("POST", "/stores/stock/keys", b'["' + b"k" * 5000 + b'"]'),
        400,
    ),
    ("9 KB query string", request("GET", "/stores/stock/keys/x?pad=" + "p" * 9000), 414),
    ("windows from=%FF", request("GET", "/stores/sales_10m/keys/x/windows?from=%FF"), 400),
    (
        "windows limit 10^30",
        request("GET", f"/stores/sales_10m/keys/x/windows?limit={'9' * 30}"),
        400,
    ),
    ("windows after garbage", request("GET", "/stores/sales_10m/keys/x/windows?after=%00"), 400),
    ("range of a point store", request("GET", "/stores/stock/keys/x/range"), 400),
    ("unknown path", request("GET", "/nowhere"), 404),
    ("method not allowed", request("DELETE", "/stores"), 405),
    ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n", 400),
]


@pytest.mark.parametrize(("case", "raw", "status"), HOSTILE, ids=[c for c, _, _ in HOSTILE])
def test_hostile_input_is_4xx_and_harms_nothing(
    running: InstanceProcess, case: str, raw: bytes, status: int
) -> None:
    got, headers, body = exchange(running.url, raw)
    assert got == status, (case, got, body[:300])
    if case != "not HTTP":  # uvicorn's own answer to bytes that are no HTTP request
        assert headers[b"content-type"] == b"application/json", headers
        assert json.loads(body)["error"], body
    every_partition_works(running)


def test_percent_ff_and_fe_are_never_one_key(running: InstanceProcess) -> None:
    """Both were decoded to U+FFFD: a command on ``a%FF`` wrote the key ``a%FE`` reads."""
    for encoded in ("a%FF", "a%FE", "a%EF%BF%BD"):
        status, _ = http(
            "POST", f"{running.url}/commands/product/{encoded}/receive_shipment", {"quantity": 1}
        )
        assert status == (200 if encoded == "a%EF%BF%BD" else 400), encoded
    wait_until(
        lambda: http("GET", f"{running.url}/stores/stock/keys/a%EF%BF%BD")[0] == 200,
        lambda: "the command on a\ufffd was not folded",
    )
    assert http("GET", f"{running.url}/stores/stock/keys/a%FE")[0] == 400


# -- fuzzing -------------------------------------------------------------------------------

_NAMES = st.sampled_from(
    ["stock", "sales_10m", "product", "sell", "receive_shipment", "keys", "owners", "range", ""]
)
_PERCENT = st.binary(max_size=12).map(lambda b: "".join(f"%{c:02X}" for c in b))
_TEXT = st.text(max_size=20).map(lambda t: urllib.parse.quote(t, safe=""))
_SEGMENT = st.one_of(_NAMES, _PERCENT, _TEXT, st.sampled_from(["%", "%G1", "%2F", "..", "a b"]))
_NUMBER = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", "-1", "1.5", "1e3", "０", "9" * 30, "0x10", " 1", "١"]),
)
_QUERY = st.lists(
    st.tuples(
        st.sampled_from(
            ["hops", "max_lag", "expected_version", "x", "", "from", "to", "limit", "after"]
        ),
        _NUMBER | _TEXT | _PERCENT | st.sampled_from(["2026-05-01T10:00Z", "gAAB", "AAAA"]),
    ),
    max_size=3,
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_BODY = st.one_of(
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["quantity", "q", ""]), _JSON, max_size=2).map(
        lambda v: json.dumps(v).encode()
    ),
    st.binary(max_size=64),
)
_HEADER_VALUE = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=30
)
_HEADERS = st.dictionaries(
    st.sampled_from(
        ["If-Match", "Idempotency-Key", "Authorization", "Content-Type", "Accept", "X-Anything"]
    ),
    _HEADER_VALUE | _NUMBER.filter(lambda v: all(ord(c) < 256 for c in v)),
    max_size=3,
)
_PATHS = st.one_of(
    st.tuples(_SEGMENT, _SEGMENT).map(lambda s: f"/stores/{s[0]}/keys/{s[1]}"),
    st.tuples(_SEGMENT, _SEGMENT).map(lambda s: f"/stores/{s[0]}/owners/{s[1]}"),
    st.tuples(_SEGMENT, _SEGMENT, st.sampled_from(["range", "windows"])).map(
        lambda s: "/stores/{}/keys/{}/{}".format(*s)
    ),
    _SEGMENT.map(lambda s: f"/stores/{s}/keys"),
    st.tuples(_SEGMENT, _SEGMENT, _SEGMENT).map(lambda s: "/commands/{}/{}/{}".format(*s)),
    st.sampled_from(["/stores", "/cluster", "/health", "/ready", "/metrics", "/", "/stores/"]),
    st.lists(_SEGMENT, max_size=4).map(lambda s: "/" + "/".join(s)),
)
_FUZZ = settings(
    max_examples=800,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@_FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
    path=_PATHS,
    query=_QUERY,
    headers=_HEADERS,
    body=_BODY | st.none(),
)
def test_fuzzed_requests_never_get_a_server_error(
    running: InstanceProcess,
    method: str,
    path: str,
    query: str,
    headers: dict[str, str],
    body: bytes | None,
) -> None:
    target = f"{path}?{query}" if query else path
    status, _, answer = exchange(running.url, request(method, target, body, headers))
    if path == "/ready" and status == 503:  # not caught up this instant: a true answer
        assert json.loads(answer)["ready"] is False
        return
    assert status < 500, (method, target, headers, body, answer[:300])


def test_every_partition_works_after_the_fuzzing(running: InstanceProcess) -> None:
    every_partition_works(running)
