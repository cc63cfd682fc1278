@inventory
Feature: Commands append events and the read model answers queries
  A command runs against the aggregate's current state; its events are appended to Kafka and
  folded by the projection into the store the query API reads.

  Scenario: A shipment and a sale leave the difference on hand
    When I send "receive_shipment" with quantity 12 to product "bdd-1"
    And I send "sell" with quantity 5 to product "bdd-1"
    Then the store "stock" returns {"on_hand": 7} for "bdd-1"

  Scenario: Selling more than is on hand is rejected and appends nothing
    Given product "bdd-2" has received 3 items
    When I send "sell" with quantity 4 to product "bdd-2"
    Then the command is rejected with status 422 saying "only 3 on hand"
    And the store "stock" returns {"on_hand": 3} for "bdd-2"

  Scenario: Looking up a store that does not exist
    Then looking up "x" in store "nope" answers 404
