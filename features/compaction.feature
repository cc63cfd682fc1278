@compaction @restart
Feature: The broker compacts the changelogs and the cluster topic; a restore from them is the fold
  The changelogs and the cluster topic are compacted topics: the broker's log cleaner keeps the
  newest record of each key (a tombstone, for a key deleted, until delete.retention.ms has
  passed) and drops the rest, and drops aborted transactions' records. An instance that lost
  its state directory restores its stores from what the cleaner kept: the same stores as a
  plain fold of the events, deleted keys included.

  Background:
    Given the service "foldstream.testing.stockroom:service" is running on a broker of its own whose log cleaner compacts within a second

  Scenario: A store restored from its compacted changelog is the fold of the events
    When products "c-1" to "c-6" each receive 8 shipments, each folded before the next
    And products "c-1" and "c-4" sell all they hold
    Then the broker compacted the changelog of store "in_stock": one record of each product left of the 8 or more written, none of a sold-out one
    And the broker compacted the cluster topic: at most 2 records of each key left, of at least 20 written
    When the instance restarts with its state directory deleted
    Then it restored store "in_stock" from no more records than the compacted changelogs hold
    And the store "in_stock" holds a plain fold of its topic
    And looking up "c-1" in store "in_stock" answers 404 saying "no key 'c-1'"
