"""Apache Kafka for development, tests and benchmarks: its jars fetched with Maven
(:mod:`~foldstream.broker.jars`), nodes (:mod:`~foldstream.broker.node`) started as a cluster
(:class:`KafkaCluster`), and free loopback ports (:func:`free_port`)."""

from foldstream.broker.cluster import KafkaCluster
from foldstream.broker.ports import free_port

__all__ = ["KafkaCluster", "free_port"]
