@rekeying @cluster @restart
Feature: Positions and risk on a cluster: exactly once across both stages through a kill -9
  Three instances share the partitions of ``positions``, ``prices`` and ``exposure``'s
  repartition topic; one is killed with kill -9 while commands keep coming. Its partitions move to the survivors,
  whose tasks fold again what it had not committed and forward again what it had forwarded
  since: ``exposure`` skips what it applied already, and every copy of every store (active and
  standby) ends equal to the plain-Python computation from the topics.

  Background:
    Given the topic "market.prices" has 3 partitions

  Scenario: An instance killed mid-stream: every copy of every store equals the computation
    Given a cluster of 3 instances of the service "foldstream.examples.positions:service"
    When 240 random commands of the demo are sent through the instances in turn, instance 2 killed with kill -9 after 80
    Then the 2 survivors own every partition
    And every store of the service answers what a plain-Python computation of its topics gives
    And every copy of every store holds what a plain-Python computation of its topics gives
