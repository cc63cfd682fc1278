@versions
Feature: A changed fold is built beside the version answering, and answers once caught up
  A store declares the version of its fold. A service deployed with a new version beside the
  old one folds both: the old one keeps answering while the new one is built (its own state
  directories and changelog), queries switch to the new one on every instance once it has
  caught up, and the old one's topics and directories are then removed. GET /stores shows each
  version's state and progress. "foldstream rebuild" rebuilds the version answering on demand,
  beside itself, the same way.

  Scenario: Version 2 of a store is built and switched to on two instances under query load, then rebuilt on demand
    Given a cluster of 2 instances of the service's first deployment, with 24 products moved
    When the cluster is deployed again with version 2 of store "stock" beside version 1, held back
    And every product is looked up continuously through both instances
    Then GET /stores shows version 1 of "stock" serving and version 2 building
    And the lookups answer version 1's values
    When version 2 is let build
    Then "foldstream versions" follows the build until version 2 answers
    And GET /stores shows version 2 of "stock" serving and version 1 retired, on both instances
    And every lookup answered 200 with version 1's or version 2's value, never version 1's after version 2's on one instance
    And version 1's changelog and dead-letter topics and state directories are gone
    When product "sku-3" is sent "receive_shipment" with quantity 5
    Then looking it up with the command's token answers version 2's value {"on_hand": 8, "moves": 4}
    When one instance is restarted
    Then it answers "stock" with version 2 at once, and version 1's topics are not created again
    When every product is looked up continuously again through both instances
    Then "foldstream rebuild" of store "nope" exits 2 with one error line naming it
    When version 2's fold is held back again
    And "foldstream rebuild" is started for "stock"
    Then GET /stores shows version 2 rebuild 1 of "stock" building and version 2 serving, on both instances
    When the rebuild is let build
    Then it follows the rebuild until version 2 rebuild 1 answers, and exits 0
    And GET /stores shows version 2 rebuild 1 of "stock" serving and version 2 retired, on both instances
    And every lookup during the rebuild answered 200 with version 2's value
    And version 2's changelog and dead-letter topics and state directories are gone
    When the other instance is restarted
    Then it answers "stock" with version 2 rebuild 1 at once, and version 2's topics are not created again
