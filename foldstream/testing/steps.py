"""The step library: Given/When/Then sentences for pytest-bdd features, on real instances.

Loaded by :mod:`foldstream.testing.plugin`; a test module only binds its feature files::

    from pytest_bdd import scenarios

    scenarios("stock.feature")

Steps talk to the ``instance`` fixture (the service under test, or the one a
``Given the service "..." is running`` step chose). JSON in sentences is written as JSON::

    Given product "sku-1" accepted "receive_shipment" with {"quantity": 3}
    Given these events were appended to product "sku-2":
      | type             | data            |
      | ShipmentReceived | {"quantity": 4} |
    When product "sku-1" is sent "sell" with {"quantity": 5}
    Then the command is rejected with status 422 saying "only 3 on hand"
    And nothing was appended
    Then the command appended these events:
      | type              | data            |
      | Product.ItemsSold | {"quantity": 2} |
    Then the store "stock" returns {"on_hand": 1} for "sku-1"
    Then the store "stock" holds a plain fold of its topic

The other sentences: ``Given the topic "t" has 3 partitions``; ``When a "librdkafka"|"java"
producer writes these records to "t":`` (key | value table, empty value = tombstone) and ``Then
every record landed in the partition the "consistent"|"murmur2" partitioner gives its key``;
``When another writer keeps appending "cmd" with {...} to each of 40 product ids starting
"p-"`` (or ``to 20 at random of 3000 product ids starting "p-"``: 20 drawn each round),
``When product "sku-1" is sent "sell" under Idempotency-Key "k-1" with {...}`` and ``Then the
answer is the first one under Idempotency-Key "k-1", marked replayed``,
``When the store "s" has a value for "k"``, ``When the instance is killed while the writer is
still appending``, ``When the writer appends 50 more rounds and stops``, ``When the
instance is restarted``; ``Then looking up "k" in store "s" answers 404 saying "..."``, ``Then
GET "/path" answers 200 with {...}``, ``Then the instance becomes ready``, ``Then the changelog
of store "s" holds the served value of every key``.

Every waiting step waits for a condition (at most ``WAIT`` seconds), never for a fixed time.

The sentences live in modules by theme, which the plugin loads: the instance under test
(:mod:`~foldstream.testing.instance_steps`), commands and their events
(:mod:`~foldstream.testing.command_steps`), topics other producers write
(:mod:`~foldstream.testing.topic_steps`) and what stores serve
(:mod:`~foldstream.testing.store_steps`); what they share (the scenario's state, waiting, the
service under test) is :mod:`~foldstream.testing.scenario`. This module re-exports their names.

Sentences about clusters of instances (``Given a cluster of 3 instances of the service``,
routing, standby reads, ``kill -9`` of an owner under query load, restarts with lost state) are
in :mod:`foldstream.testing.cluster_steps`, loaded by :mod:`foldstream.testing.cluster_plugin`.
"""

from __future__ import annotations

from foldstream.testing.command_steps import (
    COMMAND_RETRY_S,
    another_writer,
    command_accepted,
    command_appended,
    events_appended,
    first_answer_again,
    kill_mid_stream,
    nothing_appended,
    rejected,
    send_command,
    send_keyed_command,
    writer_stops,
)
from foldstream.testing.instance_steps import (
    becomes_ready,
    get_answers_with,
    instance_gone,
    kill_server_process,
    restart,
    the_service_is_running,
    the_service_is_running_on,
)
from foldstream.testing.scenario import (
    NAME,
    REQUEST_ERRORS,
    WAIT,
    ScenarioState,
    _aggregate_class,
    _rows,
    _source,
    lookup,
    service_of,
    wait_until,
)
from foldstream.testing.store_steps import (
    changelog_matches,
    lookup_fails,
    store_has_value,
    store_is_plain_fold,
    store_returns,
)
from foldstream.testing.topic_steps import (
    landed_by_partitioner,
    produce_records,
    the_topic_exists,
)

__all__ = [
    "COMMAND_RETRY_S",
    "NAME",
    "REQUEST_ERRORS",
    "ScenarioState",
    "WAIT",
    "_aggregate_class",
    "_rows",
    "_source",
    "another_writer",
    "becomes_ready",
    "changelog_matches",
    "command_accepted",
    "command_appended",
    "events_appended",
    "first_answer_again",
    "get_answers_with",
    "instance_gone",
    "kill_mid_stream",
    "kill_server_process",
    "landed_by_partitioner",
    "lookup",
    "lookup_fails",
    "nothing_appended",
    "produce_records",
    "rejected",
    "restart",
    "send_command",
    "send_keyed_command",
    "service_of",
    "store_has_value",
    "store_is_plain_fold",
    "store_returns",
    "the_service_is_running",
    "the_service_is_running_on",
    "the_topic_exists",
    "wait_until",
    "writer_stops",
]
