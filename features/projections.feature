@projections
Feature: Projections fold events into stores, exactly once
  A projection folds the events topic into a store (one RocksDB per partition) with Spark
  Structured Streaming; every change also goes to the store's compacted changelog topic.

  Scenario: Events appended by another producer are folded too
    Given these events were appended to product "fold-1":
      | type             | data            |
      | ShipmentReceived | {"quantity": 4} |
      | ShipmentReceived | {"quantity": 5} |
      | ItemsSold        | {"quantity": 2} |
    Then the store "stock" returns {"on_hand": 7} for "fold-1"
    And the store "stock" holds a plain fold of its topic

  Scenario: The changelog holds the latest value of every key
    Given product "log-1" accepted "receive_shipment" with {"quantity": 2}
    And product "log-1" accepted "sell" with {"quantity": 2}
    And product "log-2" accepted "receive_shipment" with {"quantity": 9}
    Then the store "stock" returns {"on_hand": 0} for "log-1"
    And the store "stock" returns {"on_hand": 9} for "log-2"
    And the changelog of store "stock" holds the served value of every key

  @restart
  Scenario: Killing the instance mid-stream neither loses nor repeats an event
    When another writer keeps appending "receive_shipment" with {"quantity": 3} to each of 40 product ids starting "restart-"
    And the store "stock" has a value for "restart-39"
    And the instance is killed while the writer is still appending
    And the writer appends 50 more rounds and stops
    And the instance is restarted
    Then the store "stock" holds a plain fold of its topic
