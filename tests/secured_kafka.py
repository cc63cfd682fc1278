"""A Kafka cluster that wants TLS (and, optionally, SASL) from its clients, for tests: the
embedded broker (Tansu) behind a TLS terminator, with a throwaway CA made here.

Tansu 0.6.0 cannot serve TLS itself: ``--cert`` and ``--key`` belong to one clap argument group
that admits only one of them (``error: the argument '--cert <CERT>' cannot be used with '--key
<KEY>'``), and its TLS needs both (upstream's ``broker.rs`` still declares them so). So the
broker listens in plaintext on a loopback port only the terminator connects to, and advertises
the terminator's port: every client reaches it through TLS, verified against the CA made here
(the certificate names ``127.0.0.1`` and ``localhost``). The terminator relays bytes and nothing
else: the Kafka protocol, SASL included, is the broker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from foldstream.broker import KafkaCluster, free_port


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA's certificate (what clients trust), the server's chain and key."""

    ca: Path
    server_chain: Path
    server_key: Path


def make_certificates(directory: Path) -> Certificates:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "foldstream test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.server_chain.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    files.server_key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


class TlsTerminator:
    """Accepts TLS on ``port`` (127.0.0.1) and relays each connection's bytes to
    ``upstream_port``, in an event loop of its own thread."""

    def __init__(self, *, port: int, upstream_port: int, certificates: Certificates) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(certificates.server_chain, certificates.server_key)
        self._loop = asyncio.new_event_loop()
        # A client refusing the certificate fails its handshake: expected here, not an error.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> TlsTerminator:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._relay, "127.0.0.1", self.port, ssl=self._context),
            self._loop,
        ).result(timeout=10)
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()


async def _pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.CancelledError):
        while data := await source.read(65536):
            target.write(data)
            await target.drain()
    with contextlib.suppress(OSError, RuntimeError):
        target.close()


@dataclass(frozen=True)
class TlsCluster:
    """A running broker clients reach at ``bootstrap`` over TLS only, trusting ``ca``."""

    bootstrap: str
    ca: Path
    broker: KafkaCluster


@contextlib.contextmanager
def tls_cluster(directory: Path, *, authentication: bool = False) -> Iterator[TlsCluster]:
    """The embedded broker behind a :class:`TlsTerminator` (with SASL required when
    ``authentication``), both stopped on exit."""
    certificates = make_certificates(directory / "certs")
    tls_port = free_port()
    broker_port = next(p for p in iter(free_port, None) if p != tls_port)
    terminator = TlsTerminator(
        port=tls_port, upstream_port=broker_port, certificates=certificates
    ).start()
    try:
        with KafkaCluster(
            port=broker_port,
            advertised_port=tls_port,
            authentication=authentication,
            log_path=directory / "tansu.log",
        ) as broker:
            yield TlsCluster(f"127.0.0.1:{tls_port}", certificates.ca, broker)
    finally:
        terminator.stop()
