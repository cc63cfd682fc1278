@cluster
Feature: Instances started at the same moment share the partitions from the start
  A deployment starts its instances together. They converge to one assignment; at no moment do
  two of them claim one partition, and every partition is folded and answered by its owner.

  Scenario Outline: <size> instances started at the same moment
    When <size> fresh instances of the service are started at the same moment
    Then they converge to one assignment in which every partition has one live owner
    And no two of them ever claimed one partition, as the cluster topic records it
    And a command on every partition is folded and answered from every instance

    Examples:
      | size |
      | 2    |
      | 3    |
