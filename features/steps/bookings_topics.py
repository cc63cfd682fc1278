"""The railway bookings features' topics, emptied for each module that uses them."""

from __future__ import annotations

import pytest

from foldstream.broker import KafkaCluster
from foldstream.testing.kafka import delete_topics_where


@pytest.fixture(scope="module")
def empty_bookings_topics(broker: KafkaCluster) -> None:
    """The bookings features write railway.bookings with event times of their own: each module
    starts on empty topics of the bookings service, whatever another module wrote on this broker
    before (records later than its own would make its windows late)."""
    delete_topics_where(
        broker.bootstrap, lambda topic: topic == "railway.bookings" or topic.startswith("bookings.")
    )
