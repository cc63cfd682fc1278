"""The principal and the commands an ACL error names (the checks themselves run on a secured
broker: tests/test_kafka_security.py)."""

from __future__ import annotations

import pytest

from foldstream.kafka_acls import UNKNOWN_PRINCIPAL, Acl, principal_of


@pytest.mark.parametrize(
    ("properties", "principal"),
    [
        ({}, "User:ANONYMOUS"),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "svc-orders",
            },
            "User:svc-orders",
        ),
        (
            {
                "security.protocol": "sasl_plaintext",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "alice",
            },
            "User:alice",
        ),
        # The brokers derive these from a certificate, a Kerberos ticket or a token.
        ({"security.protocol": "SSL"}, UNKNOWN_PRINCIPAL),
        ({"security.protocol": "SASL_SSL", "sasl.username": "alice"}, UNKNOWN_PRINCIPAL),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, UNKNOWN_PRINCIPAL),
    ],
)
def test_the_principal_is_named_where_the_client_can_tell_it(
    properties: dict[str, str], principal: str
) -> None:
    assert principal_of(properties) == principal


def test_a_prefixed_acl_is_granted_with_its_pattern_type() -> None:
    acl = Acl("transactional-id", "orders.", "Write", prefixed=True)
    assert str(acl) == "Write on transactional ids prefixed 'orders.'"
    assert acl.grant_command("b:9093", "User:svc") == (
        "kafka-acls.sh --bootstrap-server b:9093 --command-config admin.properties --add "
        "--allow-principal User:svc --operation Write --transactional-id orders. "
        "--resource-pattern-type prefixed"
    )
    literal = Acl("group", "foldstream-unused", "Describe")
    assert str(literal) == "Describe on group 'foldstream-unused'"
    assert literal.grant_command("b:9093", "User:svc").endswith(
        "--operation Describe --group foldstream-unused"
    )
