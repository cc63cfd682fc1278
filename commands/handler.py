"""Runs commands against aggregates and appends the resulting events to the events topic.

The handler keeps every aggregate of the partitions it writes in memory, rebuilt at start by
replaying the events topic to its end, and updated with each command's own events once Kafka
has acknowledged them. Commands of one partition run one at a time, so a command always sees
the effects of the previous one.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from foldstream.domain import Aggregate, DomainRuleViolation, EventCodec, EventRecord, commands_of
from foldstream.errors import BrokerUnavailable, FoldstreamError
from foldstream.kafka import partition_for, producer_config, read_to_end


class UnknownCommand(FoldstreamError):
    """The aggregate or command named in a request does not exist (HTTP 404).

    Remedy: check the names against the service's aggregates and their ``@command`` methods.
    """


class InvalidArguments(FoldstreamError):
    """A command's arguments do not match its signature (HTTP 400).

    Remedy: send a JSON object whose keys and value types match the command's parameters.
    """


@dataclass(frozen=True)
class CommandResult:
    """The events a command appended and where the last one landed."""

    events: list[dict[str, Any]]
    partition: int
    offset: int


_JSON_TYPES: dict[type, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
    list: (list,),
    dict: (dict,),
}


def bind_arguments(
    signature: inspect.Signature, hints: dict[str, Any], arguments: Any
) -> dict[str, Any]:
    """Check JSON ``arguments`` against a command's signature and simple type hints."""
    if not isinstance(arguments, dict):
        raise InvalidArguments("the request body must be a JSON object of the command's arguments")
    unexpected = sorted(set(arguments) - set(signature.parameters))
    if unexpected:
        raise InvalidArguments(f"unexpected arguments {unexpected}; the command takes {signature}")
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        raise InvalidArguments(str(exc)) from exc
    for name, value in arguments.items():
        expected = _JSON_TYPES.get(typing.get_origin(hints.get(name)) or hints.get(name))  # type: ignore[arg-type]
        if expected is None:
            continue
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            raise InvalidArguments(
                f"argument {name!r} must be {hints[name].__name__}, got {type(value).__name__}"
            )
    return arguments


_ENVELOPE = frozenset({"originator_id", "originator_version", "timestamp", "originator_topic"})


class CommandHandler:
    """Handles commands for ``aggregates`` (``{"product": Product}``) on ``topic``."""

    def __init__(
        self,
        *,
        aggregates: Mapping[str, type[Aggregate]],
        bootstrap: str,
        topic: str,
        partitions: int,
        linger_ms: int = 5,
        fetch_wait_max_ms: int = 10,
        transactional_id_prefix: str = "",
    ) -> None:
        self.aggregates = dict(aggregates)
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self._codec = EventCodec()
        self._commands = {name: commands_of(cls) for name, cls in self.aggregates.items()}
        self._hints = {
            name: {c: typing.get_type_hints(getattr(cls, c)) for c in self._commands[name]}
            for name, cls in self.aggregates.items()
        }
        self._state: dict[str, Aggregate] = {}
        self._locks = [asyncio.Lock() for _ in range(partitions)]
        self._producer = Producer(producer_config(bootstrap, linger_ms=linger_ms))
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll_deliveries, daemon=True)

    def _poll_deliveries(self) -> None:
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    def partition_of(self, aggregate_id: str) -> int:
        return partition_for(aggregate_id.encode(), self.partitions)

    def assign(self, partitions: object) -> int:  # TEMPORARY until the commands branch lands
        return 0

    def revoke(self, partitions: object) -> None:  # TEMPORARY
        return None

    def start(self) -> int:
        """Rebuild every aggregate from the events topic; returns the events replayed."""
        replayed = 0
        for batch in read_to_end(
            self.bootstrap, self.topic, self.partitions, fetch_wait_max_ms=self.fetch_wait_max_ms
        ):
            for message in batch:
                self._apply(
                    EventRecord(message.key(), message.value(), tuple(message.headers() or ()))
                )
            replayed += len(batch)
        self._poller.start()
        return replayed

    def _apply(self, record: EventRecord) -> None:
        domain_event = self._codec.decode(record)
        key = record.key.decode()
        self._state[key] = domain_event.mutate(self._state.get(key))

    def signature(self, aggregate: str, command: str) -> inspect.Signature:
        try:
            return self._commands[aggregate][command]
        except KeyError:
            raise UnknownCommand(
                f"no command {command!r} on aggregate {aggregate!r}"
                if aggregate in self._commands
                else f"no aggregate {aggregate!r}; aggregates: {sorted(self._commands)}"
            ) from None

    async def handle(
        self, aggregate: str, aggregate_id: str, command: str, arguments: Any
    ) -> CommandResult:
        """Run ``command`` on the aggregate and append its events; raises on any rejection.

        Nothing is appended when the command raises (:class:`DomainRuleViolation`,
        :class:`InvalidArguments`, :class:`UnknownCommand`).
        """
        signature = self.signature(aggregate, command)
        kwargs = bind_arguments(signature, self._hints[aggregate][command], arguments)
        cls = self.aggregates[aggregate]
        key = aggregate_id.encode()
        partition = partition_for(key, self.partitions)
        async with self._locks[partition]:
            current = self._state.get(aggregate_id)
            if current is not None and not isinstance(current, cls):
                raise UnknownCommand(
                    f"{aggregate_id!r} is a {type(current).__name__}, not a {cls.__name__}"
                )
            target = current if current is not None else cls(id=aggregate_id)  # type: ignore[call-arg]
            # Commands run on a copy, so a rejected command leaves no trace in memory either.
            working = copy.deepcopy(target) if current is not None else target
            getattr(working, command)(**kwargs)
            events = list(working.collect_events())
            if not events:
                raise DomainRuleViolation(f"{command} changed nothing")
            records = [self._codec.encode(e) for e in events]
            landed = await self._append(records, partition)
            for record in records:
                self._apply(record)
        return CommandResult(
            events=[
                {
                    "type": type(e).__qualname__,
                    "version": e.originator_version,
                    **{k: v for k, v in vars(e).items() if k not in _ENVELOPE},
                }
                for e in events
            ],
            partition=landed[0],
            offset=landed[1],
        )

    async def _append(self, records: list[EventRecord], partition: int) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in records]

        def delivered(future: asyncio.Future[Any]) -> Any:
            def callback(error: Any, message: Any) -> None:
                result = (error, message.partition(), message.offset())
                loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

            return callback

        for record, future in zip(records, futures, strict=True):
            self._producer.produce(
                self.topic,
                key=record.key,
                value=record.value,
                headers=list(record.headers),
                on_delivery=delivered(future),
            )
        outcomes = await asyncio.wait_for(asyncio.gather(*futures), timeout=30)
        errors = [str(e) for e, _, _ in outcomes if e is not None]
        if errors:
            raise BrokerUnavailable(f"events not acknowledged: {errors}")
        landed = {p for _, p, _ in outcomes}
        if landed != {partition}:
            raise BrokerUnavailable(
                f"events landed in partitions {landed}, expected {partition}: the producer's "
                "partitioner does not match foldstream's (murmur2)"
            )
        return partition, outcomes[-1][2]

    def close(self) -> None:
        self._stopping.set()
        if self._poller.is_alive():
            self._poller.join(timeout=5)
        self._producer.flush(10)
