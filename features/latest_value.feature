@latest_value
Feature: Topics written by other producers are queryable (latest value per key)
  A LatestValue store keeps the latest value of every key of a topic someone else writes
  (KTable semantics: a tombstone deletes the key), with the producer's partitioner declared.
  The instance here runs on granian (`foldstream serve --server granian`), the faster server for
  lookups; every other feature runs on the default, uvicorn.

  Background:
    Given the topic "supplier.prices" has 3 partitions
    And the topic "supplier.ratings" has 5 partitions
    And the service "foldstream.examples.prices:service" is running on granian

  Scenario: JSON values from a librdkafka producer with its default partitioner
    When a "librdkafka" producer writes these records to "supplier.prices":
      | key    | value          |
      | item-0 | {"cents": 0}   |
      | item-1 | {"cents": 10}  |
      | item-2 | {"cents": 20}  |
      | item-3 | {"cents": 30}  |
      | item-4 | {"cents": 40}  |
      | item-5 | {"cents": 50}  |
      | item-0 | {"cents": 999} |
      | item-1 |                |
    Then every record landed in the partition the "consistent" partitioner gives its key
    And the store "prices" returns {"cents": 999} for "item-0"
    And looking up "item-1" in store "prices" answers 404 saying "no key 'item-1' in store 'prices'"
    And the store "prices" holds a plain fold of its topic

  Scenario: Text values from a Java-compatible producer (murmur2)
    When a "java" producer writes these records to "supplier.ratings":
      | key      | value   |
      | vendor-0 | 0 stars |
      | vendor-1 | 1 stars |
      | vendor-2 | 2 stars |
      | vendor-3 | 3 stars |
      | vendor-4 | 4 stars |
      | vendor-5 | 0 stars |
      | vendor-6 | 1 stars |
      | vendor-7 | 2 stars |
      | vendor-8 | 3 stars |
      | vendor-9 | 4 stars |
      | vendor-10 | 0 stars |
      | vendor-4 | 5 stars |
    Then every record landed in the partition the "murmur2" partitioner gives its key
    And the store "ratings" returns "5 stars" for "vendor-4"
    And the store "ratings" holds a plain fold of its topic

  Scenario: An instance on granian killed with kill -9 leaves no worker serving on
    When the instance's own process is killed with kill -9
    Then nothing of the instance answers any more
