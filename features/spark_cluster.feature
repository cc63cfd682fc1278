@spark_cluster
Feature: Projections on a Spark standalone cluster
  An instance started with `--spark-master spark://...` runs its projections' tasks on the
  cluster's executors: JVMs of their own on the cluster's workers, whose Python workers import
  foldstream and the service and fold through the instance's store host. A worker killed with
  kill -9 mid-fold, its executor and Python workers with it, loses nothing and applies nothing
  twice: Spark runs the lost task again on the surviving worker, whose fold skips what the
  stores already hold, and the instance goes on without a restart.

  Background:
    Given a Spark standalone cluster of 2 workers
    And the service runs on the Spark cluster

  Scenario: The projection folds commands on the cluster's executors
    Given product "cluster-fold-1" accepted "receive_shipment" with {"quantity": 4}
    And product "cluster-fold-1" accepted "sell" with {"quantity": 1}
    And product "cluster-fold-2" accepted "receive_shipment" with {"quantity": 7}
    Then the store "stock" returns {"on_hand": 3} for "cluster-fold-1"
    And the store "stock" returns {"on_hand": 7} for "cluster-fold-2"
    And the projection's tasks ran in the executors of the Spark cluster, not in the instance
    And the store "stock" holds a plain fold of its topic

  Scenario: A worker killed mid-fold neither loses nor repeats an event
    When another writer keeps appending "receive_shipment" with {"quantity": 3} to each of 40 product ids starting "worker-kill-"
    And the store "stock" has a value for "worker-kill-39"
    And a Spark worker is killed with kill -9 while it folds
    Then Spark runs the task it lost again on the surviving worker
    When the writer appends 50 more rounds and stops
    Then the store "stock" holds a plain fold of its topic
    And the instance is still running, ready, without a restart
