@stale_state
Feature: State that outlives its topics is rebuilt from them, never served or resumed from
  A local copy of a store records how far it read its topics, and the ids of those topics. When
  the topics change under it (a broker that kept no data comes back empty, a topic
  is deleted and created again), the instance finds out before it uses the copy, says so in one
  line of its log, and rebuilds the copy from the topics: the instance becomes ready, fresh
  commands become visible, and no value of the old topics is served as current.

  The broker and the instance run as the README's "run it by hand" commands do, each in a
  terminal of its own: Ctrl-C is SIGINT to its process group.

  Scenario: Run by hand as the README says, stopped with Ctrl-C and run again: nothing is lost
    Given the broker and an instance run by hand as the README says
    And product "sku-1" accepted "receive_shipment" with {"quantity": 5}
    Then the store "stock" returns {"on_hand": 5} for "sku-1"
    When both are stopped with Ctrl-C and run again the same way
    Then the instance becomes ready
    And the store "stock" returns {"on_hand": 5} for "sku-1"
    When product "sku-1" is sent "receive_shipment" with {"quantity": 2}
    Then the store "stock" returns {"on_hand": 7} for "sku-1"
    And the store "stock" holds a plain fold of its topic

  Scenario: A broker that keeps nothing, stopped with Ctrl-C and run again, twice
    Given a broker that keeps nothing and an instance run by hand
    And product "sku-4" accepted "receive_shipment" with {"quantity": 5}
    Then the store "stock" returns {"on_hand": 5} for "sku-4"
    When both are stopped with Ctrl-C and run again the same way
    Then the instance becomes ready
    And looking up "sku-4" in store "stock" answers 404 saying "no key"
    And the instance said once that it rebuilt the copy of store "stock" holding "sku-4", because "topic inventory.events is not the one the copy was built from"
    When product "sku-4" is sent "receive_shipment" with {"quantity": 2}
    Then the store "stock" returns {"on_hand": 2} for "sku-4"
    When both are stopped with Ctrl-C and run again the same way
    Then the instance becomes ready
    And looking up "sku-4" in store "stock" answers 404 saying "no key"
    When product "sku-4" is sent "receive_shipment" with {"quantity": 3}
    Then the store "stock" returns {"on_hand": 3} for "sku-4"
    And the store "stock" holds a plain fold of its topic

  Scenario: A source topic and its changelog deleted and created again under a stopped instance
    Given the broker and an instance run by hand as the README says
    And product "sku-2" accepted "receive_shipment" with {"quantity": 4}
    Then the store "stock" returns {"on_hand": 4} for "sku-2"
    When the instance is stopped with Ctrl-C, the topics "inventory.events" and "inventory.stock.changelog" are deleted and created again, and the instance is run again
    Then the instance becomes ready
    And looking up "sku-2" in store "stock" answers 404 saying "no key"
    And the instance said once that it rebuilt the copy of store "stock" holding "sku-2", because "topic inventory.stock.changelog is not the one the copy was built from"
    When product "sku-2" is sent "receive_shipment" with {"quantity": 1}
    Then the store "stock" returns {"on_hand": 1} for "sku-2"
    And the changelog of store "stock" holds the served value of every key

  Scenario: A source topic deleted and created again, its changelog kept with the old values
    Given the broker and an instance run by hand as the README says
    And product "sku-3" accepted "receive_shipment" with {"quantity": 6}
    Then the store "stock" returns {"on_hand": 6} for "sku-3"
    When the instance is stopped with Ctrl-C, the topic "inventory.events" is deleted and created again, and the instance is run again
    Then the instance becomes ready
    And looking up "sku-3" in store "stock" answers 404 saying "no key"
    And the instance said once that it rebuilt the copy of store "stock" holding "sku-3", because "(inventory.stock.changelog holds values of the earlier topic, which are ignored)"
    When product "sku-3" is sent "receive_shipment" with {"quantity": 7}
    Then the store "stock" returns {"on_hand": 7} for "sku-3"
    And the store "stock" holds a plain fold of its topic
