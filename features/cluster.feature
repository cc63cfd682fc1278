@cluster
Feature: A cluster of instances shares the partitions, and any instance answers any key
  Instances of one service split the partitions (a sticky, standby-aware assignment planned by
  one of them over the cluster topic) and keep standby copies from the changelogs. A lookup or command reaching an instance that does not own the
  key's partition is sent to the owner (307); a standby answers only when the client accepts
  its lag (max_lag); when an owner dies, its partitions move to the survivors. No client is
  sent to a member that is gone, or whose heartbeats are late (a suspect): it gets a standby
  copy within its max_lag, or a 503 with Retry-After.

  Background:
    Given the topic "supplier.ratings" has 5 partitions
    And a cluster of 3 instances of the service "foldstream.examples.storefront:service"

  Scenario: Every key is answered from any instance by the owner of its partition
    Given products "route-1" to "route-30" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn
    Then every key is answered in store "stock" from every instance by its owner

  Scenario: Every instance names the owners the cluster map names
    Given products "owner-1" to "owner-12" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn
    Then the owners of every key in store "stock" agree with the cluster map

  Scenario: A standby answers within max_lag, and otherwise sends the client to the owner
    Given products "standby-1" to "standby-3" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn
    Then a standby of "standby-1" answers it in store "stock" with max_lag 0
    And without max_lag the standby sends the client to the owner

  Scenario: A standby answers a read with a command's token only with state that includes the command
    When product "standby-ryw-1" is sent "receive_shipment" with {"quantity": 4} through the cluster
    Then a standby of "standby-ryw-1" in store "stock" answers {"on_hand": 4} with that command's token
    When product "standby-ryw-1" is sent "sell" with {"quantity": 3} through the cluster
    Then a standby of "standby-ryw-1" in store "stock" answers {"on_hand": 1} with that command's token

  Scenario: A standby behind by more than max_lag never answers a read with that max_lag
    Given products "behind-1" to "behind-1" accepted "receive_shipment" with {"quantity": 4} through the instances in turn
    Then a standby of "behind-1" answers it in store "stock" with max_lag 0
    When a transaction left open on the changelog of store "stock" holds back the standby of "behind-1"
    And product "behind-1" is sent "receive_shipment" with {"quantity": 6} through the cluster
    Then the owner of "behind-1" in store "stock" answers {"on_hand": 10}
    And the standby of "behind-1" answers {"on_hand": 4} with max_lag its lag from the transaction
    And the standby of "behind-1" sends every read with a max_lag below its lag to the owner
    When the transaction is aborted
    Then a standby of "behind-1" answers it in store "stock" with max_lag 0

  Scenario: A foreign topic's records are found through the router, where its producer put them
    When a "java" producer writes these records to "supplier.ratings":
      | key              | value   |
      | cluster-vendor-1 | 1 stars |
      | cluster-vendor-2 | 2 stars |
      | cluster-vendor-3 | 3 stars |
      | cluster-vendor-4 | 4 stars |
      | cluster-vendor-5 | 5 stars |
      | cluster-vendor-6 | 1 stars |
      | cluster-vendor-7 | 2 stars |
      | cluster-vendor-8 | 3 stars |
      | cluster-vendor-9 | 4 stars |
      | cluster-vendor-1 | 5 stars |
    Then every record landed in the partition the "murmur2" partitioner gives its key
    And every key is answered in store "ratings" from every instance by its owner

  Scenario: Conflicting commands through different instances: exactly one is applied
    Given product "contended-1" accepted "receive_shipment" with {"quantity": 10}
    When 9 clients send "sell" with {"quantity": 7} to product "contended-1" at once, expecting version 2, through the instances in turn
    Then exactly one succeeded and the others got 409
    And the store "stock" returns {"on_hand": 3} for "contended-1"

  Scenario: Malformed and forged records on the cluster topic are ignored, never fatal
    When someone writes malformed and forged records to the cluster topic
    Then every instance counts them as invalid records of the cluster topic
    And a "receive_shipment" with {"quantity": 2} to a new product on every partition shows {"on_hand": 2} in store "stock" on every instance
    And no instance redirects to a URL that is not a member's

  @restart
  Scenario: An instance that lost its state directory restores it from the changelog
    Given products "restore-1" to "restore-30" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn
    Then every key is answered in store "stock" from every instance by its owner
    When instance 2 restarts with its state directory deleted
    Then it serves its partitions of store "stock", restored from the changelog

  Scenario: An owner paused past its session timeout changes no copy by writing late
    When another writer keeps appending "receive_shipment" with {"quantity": 1} to 20 at random of 3000 product ids starting "pause-"
    And the owner of "pause-0" in store "stock" is paused mid-fold until others wrote to its partitions
    And the writer appends 100 more rounds and stops
    Then every copy of store "stock" holds the fold of its partition's events
    And the paused instance gave its partitions of store "stock" up on resuming
    And a "receive_shipment" with {"quantity": 2} to a new product on every partition shows {"on_hand": 2} in store "stock" on every instance

  Scenario: Killing an owner under query load: clients get correct answers or 503s, never a redirect to the dead owner
    Given products "fail-1" to "fail-40" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn
    When clients keep querying every key of store "stock" on every instance, also with max_lag 1000
    And the owner of "fail-1" in store "stock" is killed with kill -9
    Then every key is answered again within 30 seconds, with no wrong answer and only 200 or 503 with Retry-After seen
    And no instance redirected a client to the killed instance after it died
    And reads with max_lag of the killed instance's partitions were answered again within 1.5 seconds of the kill
    And the 2 survivors own every partition
    And each partition of the killed instance went to an instance that kept a standby copy of it

  Scenario: A joining instance warms up, then takes partitions without downtime for the others
    Given products "join-1" to "join-40" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn
    When clients keep querying every key of store "stock" on every instance
    And a new instance joins the cluster
    Then the new instance takes over partitions once its standby copies have caught up
    And the partitions that stayed with their owner were answered throughout, never with 503

  Scenario: After its owner is killed, commands go on at the aggregate's true version, and a read with their token sees them
    Given product "failover-1" accepted "receive_shipment" with {"quantity": 10}
    And product "failover-1" accepted "sell" with {"quantity": 1}
    When the owner of "failover-1" in store "stock" is killed with kill -9
    Then through a survivor product "failover-1" sent "sell" with {"quantity": 1} expecting version 2 is refused with 409 naming version 3
    And through a survivor product "failover-1" sent "sell" with {"quantity": 2} expecting version 3 is accepted
    And every survivor answers {"on_hand": 7} for "failover-1" in store "stock" with that command's token
