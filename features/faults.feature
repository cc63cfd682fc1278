@cluster @faults
Feature: Faults recover without a restart
  When the broker stops answering, commands answer 503 with Retry-After instead of hanging
  forever, and once it answers again every part (projections, standby copies, membership,
  command writers) resumes by itself: nothing needs a restart.

  Scenario: The broker stands still for 30 seconds under a cluster of 2 instances
    Given a cluster of 2 instances of the inventory example on a broker of its own
    When the broker stands still for 30 seconds while a client keeps sending commands
    Then every command sent meanwhile answered 200, or 503 with Retry-After
    And within 15 seconds of the broker's return a command on every partition is folded and answered from every instance
    And both instances become ready again
