@recovery
Feature: Projections recover by themselves, and a record they cannot fold never stalls a store
  A record whose fold fails is tried again a few times in its task. One that keeps failing is a
  poison record: its store's policy (on_error) decides, and the store moves on unless told to
  stop: "dead-letter" (the default) sends it to <service>.<store>.dlq, "skip" counts and skips
  it, "stop" stops folding its partition only, which /ready names, until the instance restarts.
  A failure of the infrastructure (the broker, the store host) is never the record's: the
  failed query is restarted from the offsets its stores hold, forever, with growing waits, and
  /ready names the failure while it lasts. Nothing is applied twice: the stores skip the
  offsets they already hold.

  Background:
    Given the topic "flaky.records" has 2 partitions
    And the service "foldstream.testing.flaky:service" is running
    And the instance's metrics were read

  Scenario: A record whose fold fails twice is applied on the third attempt
    When a record with key "twice" of "flaky.records" fails in store "flaky" 2 times
    Then the store "flaky" has a value for "twice"
    And folding "twice" into "flaky" was attempted 3 times
    And nothing was dead-lettered for "twice" by store "flaky"
    And the instance becomes ready

  Scenario: A record that always fails is dead-lettered by default and the store moves on
    When a record with key "always" of "flaky.records" has the value {"n": 1}
    Then the store "flaky" returns {"n": 1} for "always"
    When a record with key "always" of "flaky.records" fails in store "flaky" 1000 times
    Then store "flaky" dead-lettered the record with key "always" saying "RuntimeError: failing on purpose: attempt 3 of 1000"
    And the store "flaky" returns {"n": 1} for "always"
    And folding "always" into "flaky" was attempted 3 times
    And its metrics count 1 more record of store "flaky" dead-lettered
    When a record with key "always" of "flaky.records" has the value {"n": 2}
    Then the store "flaky" returns {"n": 2} for "always"
    And the instance becomes ready

  Scenario: The skip policy skips a record that always fails, without dead-lettering it
    When a record with key "skipped" of "flaky.records" fails in store "flaky_skipped" 1000 times
    And a record with key "skipped" of "flaky.records" has the value {"n": 2}
    Then the store "flaky_skipped" returns {"n": 2} for "skipped"
    And folding "skipped" into "flaky_skipped" was attempted 3 times
    And its metrics count 1 more record of store "flaky_skipped" skipped
    And nothing was dead-lettered for "skipped" by store "flaky_skipped"
    And the instance becomes ready

  @restart
  Scenario: The stop policy stops only the partition of the record, until the instance restarts
    Given "stuck" and "flowing" are in different partitions of "flaky.records"
    When a record with key "stuck" of "flaky.records" fails in store "flaky_stopped" 4 times
    Then /ready names the partition of "stuck" in store "flaky_stopped" stopped at its offset, saying "RuntimeError: failing on purpose: attempt 3 of 4"
    And its metrics count 1 more record of store "flaky_stopped" stopped
    When a record with key "flowing" of "flaky.records" has the value {"n": 1}
    And a record with key "stuck" of "flaky.records" has the value {"n": 2}
    Then the store "flaky_stopped" returns {"n": 1} for "flowing"
    And the store "flaky" returns {"n": 2} for "stuck"
    And looking up "stuck" in store "flaky_stopped" answers 404 saying "no key"
    When the instance is stopped and started again
    Then the store "flaky_stopped" returns {"n": 2} for "stuck"
    And folding "stuck" into "flaky_stopped" was attempted 5 times

  Scenario: A query failing on the infrastructure is restarted until it recovers, /ready naming the failure meanwhile
    When a record with key "outage" of "flaky.records" finds the broker unavailable in store "flaky"
    Then the instance is not ready, saying "projection 'flaky' failed"
    And the instance is not ready, saying "BrokerUnavailable: unavailable on purpose"
    And nothing was dead-lettered for "outage" by store "flaky"
    When the broker is available again
    Then the store "flaky" has a value for "outage"
    And the instance becomes ready
