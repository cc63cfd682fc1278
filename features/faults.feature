@cluster @faults
Feature: Faults recover without a restart
  When the broker stops answering, commands answer 503 with Retry-After instead of hanging
  forever, and once it answers again every part (projections, standby copies, membership,
  command writers) resumes by itself: nothing needs a restart.

  An instance that has not read its own heartbeat back within the session timeout has lost its
  view of the cluster: it may have been replaced without knowing. Until its view is current
  again it takes no command and answers a read only from a copy of unknown lag, and only when
  the read allows any lag (max_lag=any), saying so (served_by role "unconfirmed" for its own
  partitions, lag null); every other request gets a 503 with Retry-After.

  Scenario: The broker stands still for 30 seconds under a cluster of 2 instances
    Given a cluster of 2 instances of the inventory example on a broker of its own
    And products "still-1" to "still-8" accepted "receive_shipment" with {"quantity": <n>}, every copy caught up
    When the broker stands still for 30 seconds while a client keeps sending commands and reading those products
    Then every command sent meanwhile answered 200, or 503 with Retry-After
    And once the session timeout had passed, every command answered 503 with Retry-After for a view that is not current
    And once the session timeout had passed, every read without max_lag answered 503 with Retry-After
    And once the session timeout had passed, every read with max_lag=any was answered by the instance asked from a copy of unknown lag, with the product's value
    And within 15 seconds of the broker's return a command on every partition is folded and answered from every instance
    And both instances become ready again
