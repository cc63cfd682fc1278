"""Steps for the command side's replay of records it cannot apply (written with
:mod:`foldstream.testing.poison_steps`).

::

    Then product "bad" refuses "receive_shipment" with {"quantity": 1}, naming the record it
      could not replay                                                   (one line)
    Then product "ok" still takes "receive_shipment" with {"quantity": 1}
    Then the instance's replays skipped at least 1 record
"""

from __future__ import annotations

import json
from typing import Any

from pytest_bdd import parsers, then

from foldstream.process import InstanceProcess, http
from foldstream.scrape import scrape
from foldstream.testing.poison_steps import Written


def _command(
    instance: InstanceProcess, aggregate: str, aggregate_id: str, command: str, arguments: str
) -> tuple[int, Any]:
    url = f"{instance.url}/commands/{aggregate}/{aggregate_id}/{command}"
    return http("POST", url, json.loads(arguments))


@then(
    parsers.re(
        r'(?P<aggregate>[\w-]+) "(?P<aggregate_id>[^"]+)" refuses "(?P<command>\w+)" with '
        r"(?P<arguments>\{.*\}), naming the record it could not replay"
    )
)
def refuses_commands(
    instance: InstanceProcess,
    written: dict[str, list[Written]],
    aggregate: str,
    aggregate_id: str,
    command: str,
    arguments: str,
) -> None:
    record = written[aggregate_id][0]
    status, body = _command(instance, aggregate, aggregate_id, command, arguments)
    assert status == 409, body
    assert f"partition {record.partition} offset {record.offset}" in body["error"], body


@then(
    parsers.re(
        r'(?P<aggregate>[\w-]+) "(?P<aggregate_id>[^"]+)" still takes "(?P<command>\w+)" with '
        r"(?P<arguments>\{.*\})"
    )
)
def still_takes_commands(
    instance: InstanceProcess, aggregate: str, aggregate_id: str, command: str, arguments: str
) -> None:
    status, body = _command(instance, aggregate, aggregate_id, command, arguments)
    assert status == 200, body


@then(parsers.re(r"the instance's replays skipped at least (?P<count>\d+) records?"))
def replays_skipped(instance: InstanceProcess, count: str) -> None:
    skipped = scrape(instance.url).get(("foldstream_command_replay_skipped_total", frozenset()))
    assert skipped is not None and skipped >= int(count), skipped
