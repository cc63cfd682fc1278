@commands @restart
Feature: The command side keeps its aggregates in the aggregate store
  Each events partition's aggregates are kept as snapshots in a store partition with its own
  compacted changelog, written after each committed transaction. A takeover restores that
  store and replays only the events past its snapshots; memory holds a bounded cache. The
  events topic stays the source of truth: an expected version is checked against the
  aggregate's true version after any restart.

  Scenario: After a graceful restart the command side replays no event its snapshots hold
    Given product "snap-1" accepted "receive_shipment" with {"quantity": 10}
    And product "snap-1" accepted "sell" with {"quantity": 1}
    When the instance is stopped and started again
    Then the command side replayed no event at its takeover
    And product "snap-1" sent "sell" with {"quantity": 1} expecting version 2 is refused with 409 naming version 3
    And product "snap-1" sent "sell" with {"quantity": 1} expecting version 3 is accepted
    And the store "stock" returns {"on_hand": 8} for "snap-1"

  Scenario: After kill -9 a stale expected version is still refused
    Given product "snap-2" accepted "receive_shipment" with {"quantity": 10}
    And product "snap-2" accepted "sell" with {"quantity": 1}
    And product "snap-2" accepted "sell" with {"quantity": 1}
    When the instance is killed with kill -9
    And the instance is restarted
    Then product "snap-2" sent "sell" with {"quantity": 1} expecting version 3 is refused with 409 naming version 4
    And product "snap-2" sent "sell" with {"quantity": 1} expecting version 4 is accepted
    And the store "stock" returns {"on_hand": 7} for "snap-2"
