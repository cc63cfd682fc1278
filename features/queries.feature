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

  Scenario Outline: A query parameter a route does not take is refused with 400 naming it
    A lookup's ?after=TOKEN (a spelling an earlier design used) was ignored: the read was
    answered without waiting for the token, stale.

    Then GET "<path>" answers 400 saying "<reason>"

    Examples:
      | path                                                | reason                                                                                                   |
      | /stores/stock/keys/sku-1?after=f1-0-1-0a0b0c0d      | unknown query parameter(s) of GET /stores/{store}/keys/{key}: 'after'; this route takes max_lag, consistent_with, hops |
      | /stores/stock/keys/sku-1?max_lags=5                 | 'max_lags' (did you mean 'max_lag'?)                                                                     |
      | /stores/stock/keys/sku-1?consistent_width=f1-0-1-0  | 'consistent_width' (did you mean 'consistent_with'?)                                                     |
      | /stores/sales_10m/keys/sku-1/windows?page=2         | unknown query parameter(s) of GET /stores/{store}/keys/{key}/windows: 'page'                             |
      | /stores/stock/owners/sku-1?max_lag=0                | unknown query parameter(s) of GET /stores/{store}/owners/{key}: 'max_lag'; this route takes none         |
      | /stores?verbose=1                                   | unknown query parameter(s) of GET /stores: 'verbose'                                                     |
      | /cluster?x=1                                        | unknown query parameter(s) of GET /cluster: 'x'                                                          |
      | /health?probe                                       | unknown query parameter(s) of GET /health: 'probe'                                                       |
      | /ready?max_lag=0                                    | unknown query parameter(s) of GET /ready: 'max_lag'                                                      |
      | /metrics?name[]=x                                   | unknown query parameter(s) of GET /metrics: 'name[]'                                                     |
      | /openapi.json?v=2                                   | unknown query parameter(s) of GET /openapi.json: 'v'                                                     |
      | /docs/?url=https://example.com/openapi.json         | unknown query parameter(s) of GET /docs/: 'url'                                                          |
      | /ui/?x=1                                            | unknown query parameter(s) of GET /ui/: 'x'                                                              |
      | /ui/api/lookup/stock/sku-1?max_lag=0                | unknown query parameter(s) of GET /ui/api/lookup/{store}/{key}: 'max_lag'                                |
