@cluster
Feature: A member whose heartbeats are late is a suspect: no client is sent to it
  A member whose heartbeats are late by more than --suspect-after-ms (1 s by default, well
  under the session timeout) in another instance's view, or whose HTTP port closed that
  instance's connection to it, is a suspect there. It stays a member and keeps its partitions
  until the session timeout, but no instance redirects to it, the cluster map names no owner
  for its partitions (it names the suspect), and smart clients send it nothing: a read of its
  partitions is answered by a standby copy within the read's max_lag, or 503 with Retry-After,
  and so is a command. It is a suspect no more as soon as one of its heartbeats is read.

  Background:
    Given a cluster of 3 instances of the inventory example with a session timeout of 20 seconds
    And products "late-1" to "late-24" accepted "receive_shipment" with {"quantity": <n>} through the instances in turn

  Scenario: An owner that stands still is a suspect until it beats again
    When the owner of "late-1" in store "stock" stands still until every other instance suspects it
    Then the others' cluster maps list it as a suspect, naming no owner for its partitions
    And the others answer a read of each of its keys with 503 and Retry-After, never a redirect to it
    And the others answer a read of each of its keys with max_lag 1000 from a standby copy
    And the others answer a command to each of its products with 503 and Retry-After
    And foldstream status, asked of another instance, shows it as a suspect and exits 1
    And a smart client reads each of its keys with max_lag 1000 without sending it a request
    And the dashboard of another instance shows it as a suspect
    When it resumes
    Then no instance suspects it any more
    And every key is answered in store "stock" from every instance by its owner
