@queries
Feature: Queries read the stores; unknown stores and keys answer 404
  The query API serves every store of the service by key, and says whether the instance is
  alive and caught up.

  Scenario: The stores are listed with their partitions, partitioner, kind and versions
    Then GET "/stores" answers 200 with {"stores": [{"name": "stock", "partitions": 4, "partitioner": "murmur2", "kind": "point", "version": 1, "generation": 0, "versions": [{"version": 1, "state": "serving", "folded": null, "behind": null, "total": null, "generation": 0}]}, {"name": "sales_10m", "partitions": 4, "partitioner": "murmur2", "kind": "windowed", "version": 1, "generation": 0, "versions": [{"version": 1, "state": "serving", "folded": null, "behind": null, "total": null, "generation": 0}]}]}

  Scenario: A running instance is alive and ready
    Then GET "/health" answers 200 with {"status": "alive"}
    And the instance becomes ready

  Scenario: Looking up a store that does not exist
    Then looking up "x" in store "nope" answers 404 saying "no store named 'nope'"

  Scenario: Looking up a key the store does not hold
    Then looking up "never-seen" in store "stock" answers 404 saying "no key 'never-seen' in store 'stock'"
