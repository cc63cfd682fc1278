"""Every error a command may end with is answered in one place, with its status and fields."""

from __future__ import annotations

import json

import pytest

from foldstream.commands.arguments import InvalidArguments
from foldstream.commands.http import COMMAND_ERRORS, command_error
from foldstream.commands.outcomes import UnknownCommand, VersionConflict
from foldstream.domain import DomainRuleViolation
from foldstream.errors import (
    BrokerUnavailable,
    InvalidRequest,
    NotOwner,
    PartitionFenced,
    RecordTooLarge,
)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidRequest("URL too long", status=414), 414),
        (InvalidArguments("quantity: not an integer"), 400),
        (UnknownCommand("no command 'fly'"), 404),
        (RecordTooLarge("event of 2000000 bytes"), 413),
        (DomainRuleViolation("cannot sell 11"), 422),
        (BrokerUnavailable("no answer for 30.0s"), 503),
    ],
)
def test_each_error_has_its_status_and_a_503_says_when_to_retry(
    error: Exception, status: int
) -> None:
    assert isinstance(error, COMMAND_ERRORS)
    response = command_error(error)
    assert response.status_code == status
    assert json.loads(response.body) == {"error": str(error)}
    assert ("retry-after" in response.headers) == (status == 503)


def test_a_conflict_names_both_versions_and_a_partition_owned_elsewhere_is_named() -> None:
    conflict = command_error(VersionConflict("sku-1", expected=3, current=5))
    assert conflict.status_code == 409
    assert json.loads(conflict.body) == {
        "error": "'sku-1' is at version 5, not 3",
        "expected_version": 3,
        "current_version": 5,
    }
    fenced = command_error(PartitionFenced(4))
    assert (fenced.status_code, fenced.headers["retry-after"]) == (503, "1")
    assert json.loads(fenced.body)["partition"] == 4
    assert isinstance(PartitionFenced(4), NotOwner)
