@rekeying
Feature: Positions and risk: trades re-keyed by asset, joined with another producer's prices
  ``exposure`` folds the trades re-keyed by asset and the changes of ``prices`` (a latest-value
  store of the foreign topic ``market.prices``), both through its repartition topic: a trade or
  a price tick updates it, in either order.

  Background:
    Given the topic "market.prices" has 3 partitions

  Scenario: Exposure follows trades and price ticks, in either order
    Given the service "foldstream.examples.positions:service" is running
    And account "acct-1" accepted "buy" with {"asset": "ACME", "quantity": 10}
    And account "acct-2" accepted "buy" with {"asset": "ACME", "quantity": 5}
    Then the store "exposure" returns {"asset": "ACME", "quantity": 15, "price": null, "value": null} for "ACME"
    When a "java" producer writes these records to "market.prices":
      | key  | value           |
      | ACME | {"price": 2.5}  |
    Then the store "exposure" returns {"asset": "ACME", "quantity": 15, "price": 2.5, "value": 37.5} for "ACME"
    When account "acct-1" is sent "sell" with {"asset": "ACME", "quantity": 11}
    Then the command is rejected with status 422 saying "cannot sell 11 ACME from acct-1: it holds 10"
    When account "acct-1" is sent "sell" with {"asset": "ACME", "quantity": 10}
    Then the store "exposure" returns {"asset": "ACME", "quantity": 5, "price": 2.5, "value": 12.5} for "ACME"
    And the store "positions" returns {"account": "acct-1", "holdings": {}} for "acct-1"
    And looking up "ACME" in store "exposure.events" answers 404 saying "no store named 'exposure.events'"

  Scenario: Random trades and ticks: every store equals the computation from the topics
    Given the service "foldstream.examples.positions:service" is running
    When 150 random commands of the demo are sent through the instances in turn
    Then every store of the service answers what a plain-Python computation of its topics gives
    And every copy of every store holds what a plain-Python computation of its topics gives

  Scenario: A price the join cannot fold is dead-lettered, naming the store, topic, partition and offset
    Given the service "foldstream.examples.positions:service" is running
    And account "acct-9" accepted "buy" with {"asset": "BADPX", "quantity": 1}
    When a "java" producer writes these records to "market.prices":
      | key   | value              |
      | BADPX | {"price": "cheap"} |
    Then store "exposure" dead-lettered what was forwarded from the last record of "market.prices" with key "BADPX", naming the store, the topic, the partition and the offset
    And the store "exposure" returns {"asset": "BADPX", "quantity": 1, "price": null, "value": null} for "BADPX"
    And the store "prices" returns {"price": "cheap"} for "BADPX"
