"""A Kafka cluster secured as production ones are, for tests: Apache Kafka serving SASL_SSL
itself (SCRAM-SHA-512 over TLS, with a throwaway CA made here) and authorizing every request
with ``StandardAuthorizer`` against ACLs.

The brokers log in to each other as :data:`ADMIN`, a super user; every other user has exactly
the ACLs a test grants it (``allow.everyone.if.no.acl.found`` stays false). Users are created
with their SCRAM credentials when the storage is formatted (``--add-scram``).

The controller listener stays PLAINTEXT on 127.0.0.1, so the principal of every request on it
is ``User:ANONYMOUS``, which must be a super user (the brokers register and fetch metadata
there, and the controller authorizes those requests too). Anything on this machine that can
reach the controller port therefore acts as a super user: fine for a test broker on loopback,
never for a cluster others share (secure the controller listener there as well).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from foldstream.broker import KafkaCluster

#: The brokers' own user (and the tests' administrator): a super user.
ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA's certificate (what clients trust), the server's chain and key, and
    both in one file (a Kafka listener's PEM key store)."""

    ca: Path
    server_chain: Path
    server_key: Path
    server_keystore: Path


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
            x509.ExtendedKeyUsage(
                [
                    x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                    # The brokers connect to each other with the same certificate's trust.
                    x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH,
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = Certificates(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "server-keystore.pem",
    )
    chain = cert.public_bytes(pem) + ca_cert.public_bytes(pem)
    private = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.server_chain.write_bytes(chain)
    files.server_key.write_bytes(private)
    files.server_keystore.write_bytes(private + chain)
    return files


def client_properties(ca: Path, user: str, password: str) -> dict[str, str]:
    """librdkafka's client properties of ``user`` logging in with ``password``."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca),
    }


@dataclass(frozen=True)
class SecuredCluster:
    """A running cluster clients reach at ``bootstrap`` with SASL_SSL only, trusting ``ca``;
    ``passwords`` of its users."""

    cluster: KafkaCluster
    ca: Path
    passwords: Mapping[str, str]

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def client_properties(self, user: str, password: str | None = None) -> dict[str, str]:
        """The client properties of ``user`` (with its password, or ``password``)."""
        chosen = self.passwords[user] if password is None else password
        return client_properties(self.ca, user, chosen)

    def environment(self, user: str, password: str | None = None) -> dict[str, str]:
        """The same as ``KAFKA_*`` variables, as an instance reads them."""
        return {
            "KAFKA_" + name.upper().replace(".", "_"): value
            for name, value in self.client_properties(user, password).items()
        }

    def admin(self) -> AdminClient:
        """An admin client of :data:`ADMIN`, the super user."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        return AdminClient({**config, **self.client_properties(ADMIN)})


def broker_properties(certificates: Certificates, admin_password: str) -> dict[str, str]:
    """The brokers' SASL_SSL listener (its PEM key store and trust store), their own SCRAM
    login, the authorizer and the super users (see the module's docstring for ANONYMOUS)."""
    login = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{admin_password}";'
    )
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certificates.server_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certificates.ca),
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config": login,
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{ADMIN};User:ANONYMOUS",
    }


@contextlib.contextmanager
def secured_cluster(
    directory: Path, users: Mapping[str, str], *, admin_password: str = "admin-s3cret"
) -> Iterator[SecuredCluster]:
    """A one-node cluster in ``directory`` serving SASL_SSL with SCRAM-SHA-512, ``users``
    (``{name: password}``, with no ACLs) and :data:`ADMIN` created at format time; stopped on
    exit."""
    certificates = make_certificates(directory / "certs")
    passwords = {ADMIN: admin_password, **users}
    scram = [
        arg
        for name, password in passwords.items()
        for arg in ("--add-scram", f"{MECHANISM}=[name={name},password={password}]")
    ]
    cluster = KafkaCluster(
        data_dir=directory / "kafka",
        client_protocol="SASL_SSL",
        properties=broker_properties(certificates, admin_password),
        format_args=scram,
        client_config=client_properties(certificates.ca, ADMIN, admin_password),
    )
    with cluster:
        yield SecuredCluster(cluster, certificates.ca, passwords)


#: Every ACL of the cluster (None matches any name, principal and host: the stubs say str).
_EVERY_ACL = AclBindingFilter(
    ResourceType.ANY,
    None,  # type: ignore[arg-type]
    ResourcePatternType.ANY,
    None,  # type: ignore[arg-type]
    None,  # type: ignore[arg-type]
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def set_acls(
    secured: SecuredCluster, bindings: Iterable[AclBinding], timeout: float = 30.0
) -> None:
    """Make ``bindings`` the cluster's only ACLs, and return once the broker lists exactly
    them: it authorizes requests with the ACLs it lists (the controller commits them first)."""
    wanted = set(bindings)
    admin = secured.admin()
    for future in admin.delete_acls([_EVERY_ACL]).values():
        future.result(timeout=timeout)
    if wanted:
        for future in admin.create_acls(list(wanted)).values():
            future.result(timeout=timeout)
    Retrying(
        stop=stop_after_delay(timeout),
        wait=wait_fixed(0.1),
        retry=retry_if_result(lambda listed: listed != wanted),
    )(lambda: set(admin.describe_acls(_EVERY_ACL).result(timeout=timeout)))
