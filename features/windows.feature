@windows
Feature: Windowed sales: units sold per product in 10-minute windows of the sales' own times
  The inventory example's store sales_10m folds each product's sales into 10-minute tumbling
  windows by the events' timestamps. Each partition's stream time is the latest event time it
  has seen. A sale that arrives out of order is added to its window until the window closes, a
  minute (the grace) after its end by stream time; a later one is dropped, and counted in
  /metrics. A window is deleted a day (the retention) after its end. The sales here are dated
  in the next century: the partitions' stream times move past every sale sent today.

  Scenario: Out-of-order sales within the grace are added; later ones are dropped and counted
    Given the instance's metrics were read
    And these events were appended to product "window-1":
      | type             | data             | timestamp                 |
      | ShipmentReceived | {"quantity": 50} | 2101-03-01T10:00:00+00:00 |
      | ItemsSold        | {"quantity": 2}  | 2101-03-01T10:01:00+00:00 |
      | ItemsSold        | {"quantity": 3}  | 2101-03-01T10:10:30+00:00 |
      | ItemsSold        | {"quantity": 4}  | 2101-03-01T10:09:00+00:00 |
      | ItemsSold        | {"quantity": 1}  | 2101-03-01T10:12:00+00:00 |
      | ItemsSold        | {"quantity": 7}  | 2101-03-01T10:05:00+00:00 |
    Then the windows of "window-1" in store "sales_10m" are:
      | start                    | end                      | value        |
      | 2101-03-01T10:00:00.000Z | 2101-03-01T10:10:00.000Z | {"units": 6} |
      | 2101-03-01T10:10:00.000Z | 2101-03-01T10:20:00.000Z | {"units": 4} |
    And the windows of "window-1" in store "sales_10m" from "2101-03-01T10:05:00Z" to "2101-03-01T10:30:00Z" are:
      | start                    | end                      | value        |
      | 2101-03-01T10:10:00.000Z | 2101-03-01T10:20:00.000Z | {"units": 4} |
    And its metrics count 1 more late record of store "sales_10m"
    And the store "stock" returns {"on_hand": 33} for "window-1"

  Scenario: Windows past retention disappear
    Given these events were appended to product "window-2":
      | type      | data            | timestamp                 |
      | ItemsSold | {"quantity": 2} | 2102-03-01T10:01:00+00:00 |
      | ItemsSold | {"quantity": 3} | 2102-03-01T20:00:00+00:00 |
    Then the windows of "window-2" in store "sales_10m" are:
      | start                    | end                      | value        |
      | 2102-03-01T10:00:00.000Z | 2102-03-01T10:10:00.000Z | {"units": 2} |
      | 2102-03-01T20:00:00.000Z | 2102-03-01T20:10:00.000Z | {"units": 3} |
    When these events were appended to product "window-3" in the partition of "window-2":
      | type      | data            | timestamp                 |
      | ItemsSold | {"quantity": 1} | 2102-03-02T10:10:00+00:00 |
    Then the windows of "window-2" in store "sales_10m" are:
      | start                    | end                      | value        |
      | 2102-03-01T20:00:00.000Z | 2102-03-01T20:10:00.000Z | {"units": 3} |

  Scenario: Every product's windows are those of a plain computation over the events
    Given product "window-4" accepted "receive_shipment" with {"quantity": 5}
    And product "window-4" accepted "sell" with {"quantity": 2}
    Then the store "sales_10m" holds a plain fold of its topic

  Scenario Outline: A windows read with bad parameters, or of a store that is not windowed, gets 400
    Then GET "<path>" answers 400 saying "<reason>"

    Examples:
      | path                                                | reason                               |
      | /stores/sales_10m/keys/window-1/windows?from=noon   | from must be a time sort key         |
      | /stores/sales_10m/keys/window-1/windows?limit=5000  | limit must be an integer from 1 to 1000 |
      | /stores/sales_10m/keys/window-1/windows?after=%2A   | after is not a cursor of this store  |
      | /stores/sales_10m/keys/window-1/range               | is not ordered but windowed          |
      | /stores/stock/keys/window-1/windows                 | is not windowed but point            |
      | /stores/sales_10m/keys/window-1                     | is not point but windowed            |
