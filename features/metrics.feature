@metrics
Feature: An instance's metrics, for Prometheus
  GET /metrics answers in Prometheus' text format: the command side's transactions and the
  commands they carried, and each projection's micro-batches (duration, Spark's phases of it,
  records read) and the steps of their tasks (input, decode, read, fold, changelog, commit).

  Scenario: Commands and the micro-batches folding them are counted
    Given the instance's metrics were read
    When product "metrics-1" is sent "receive_shipment" with {"quantity": 2}
    And product "metrics-1" is sent "sell" with {"quantity": 1}
    Then the store "stock" returns {"on_hand": 1} for "metrics-1"
    And its metrics count 2 more committed commands, in 1 or 2 transactions
    And its metrics show micro-batches of store "stock" that read at least 3 records
