@recovery
Feature: A projection recovers from failed micro-batches
  A failed Spark task is tried again (four attempts in local mode). A query whose task fails
  past its attempts is restarted from the offsets its stores hold, a few times; past that the
  instance answers /ready with the failure instead of serving stale values in silence.
  Nothing is applied twice: the stores skip the offsets they already hold.

  Background:
    Given the topic "flaky.records" has 2 partitions
    And the service "foldstream.testing.flaky:service" is running

  Scenario: A record whose fold fails twice is applied on the third attempt
    When a record with key "twice" of "flaky.records" fails its projection 2 times
    Then the store "flaky" has a value for "twice"
    And folding "twice" was attempted 3 times
    And the instance becomes ready

  Scenario: A query whose task fails past its attempts is restarted from its stored offsets
    When a record with key "five-times" of "flaky.records" fails its projection 5 times
    Then the store "flaky" has a value for "five-times"
    And folding "five-times" was attempted 6 times
    And the instance becomes ready

  Scenario: A projection that keeps failing makes the instance unready, naming the error
    When a record with key "always" of "flaky.records" fails its projection 1000 times
    Then the instance is not ready, saying "projection 'flaky' failed"
