@stock
Feature: Stock on hand follows shipments and sales
  Commands on a product append events; the "stock" store folds them into what is on hand.
  The sentences come from foldstream's step library (foldstream.testing.steps).

  Scenario: A shipment and a sale leave the difference on hand
    When product "sku-1" is sent "receive_shipment" with {"quantity": 12}
    Then the command appended these events:
      | type                     | data             |
      | Product.Created          | {}               |
      | Product.ShipmentReceived | {"quantity": 12} |
    When product "sku-1" is sent "sell" with {"quantity": 5}
    Then the command appended these events:
      | type              | data            |
      | Product.ItemsSold | {"quantity": 5} |
    And the store "stock" returns {"on_hand": 7} for "sku-1"

  Scenario: Selling more than is on hand is rejected and appends nothing
    Given product "sku-2" accepted "receive_shipment" with {"quantity": 3}
    When product "sku-2" is sent "sell" with {"quantity": 4}
    Then the command is rejected with status 422 saying "only 3 on hand"
    And nothing was appended
    And the store "stock" returns {"on_hand": 3} for "sku-2"

  Scenario: Events from another producer are folded like the service's own
    Given these events were appended to product "sku-3":
      | type             | data            |
      | ShipmentReceived | {"quantity": 8} |
      | ItemsSold        | {"quantity": 3} |
    Then the store "stock" returns {"on_hand": 5} for "sku-3"
    And the store "stock" holds a plain fold of its topic

  Scenario: A product nobody has shipped is not in the store
    Then looking up "sku-unknown" in store "stock" answers 404 saying "no key 'sku-unknown'"
