@cluster @ordered
Feature: Ranges and windows across a cluster: routed to the owner, read from standbys, restored
  Three instances of the railway bookings example share the 9 partitions of railway.bookings.
  A range or windows read reaching an instance that does not own the customer's partition is
  sent to the owner (307), with its query; a standby copy answers when the client accepts its
  lag (max_lag); an instance that lost its state directory restores entries, windows and the
  partitions' stream times from the changelogs.

  Background:
    Given the topic "railway.bookings" has 9 partitions
    And a cluster of 3 instances of the service "foldstream.examples.bookings:service"

  Scenario: Every instance answers every customer's range and windows through the owner
    When a "java" producer writes these records to "railway.bookings":
      | key | value | timestamp |
      | route-1 | {"trip": "trip-1-0", "booked_at": "2025-01-01T07:07:00Z"} | 2025-01-01T07:07:00Z |
      | route-1 | {"trip": "trip-1-1", "booked_at": "2025-01-02T12:07:00Z"} | 2025-01-02T12:07:00Z |
      | route-2 | {"trip": "trip-2-0", "booked_at": "2025-01-01T08:14:00Z"} | 2025-01-01T08:14:00Z |
      | route-2 | {"trip": "trip-2-1", "booked_at": "2025-01-02T13:14:00Z"} | 2025-01-02T13:14:00Z |
      | route-2 | {"trip": "trip-2-2", "booked_at": "2025-01-01T06:14:00Z"} | 2025-01-01T06:14:00Z |
      | route-3 | {"trip": "trip-3-0", "booked_at": "2025-01-01T09:21:00Z"} | 2025-01-01T09:21:00Z |
      | route-4 | {"trip": "trip-4-0", "booked_at": "2025-01-01T10:28:00Z"} | 2025-01-01T10:28:00Z |
      | route-4 | {"trip": "trip-4-1", "booked_at": "2025-01-02T15:28:00Z"} | 2025-01-02T15:28:00Z |
      | route-5 | {"trip": "trip-5-0", "booked_at": "2025-01-01T11:35:00Z"} | 2025-01-01T11:35:00Z |
      | route-5 | {"trip": "trip-5-1", "booked_at": "2025-01-02T16:35:00Z"} | 2025-01-02T16:35:00Z |
      | route-5 | {"trip": "trip-5-2", "booked_at": "2025-01-01T09:35:00Z"} | 2025-01-01T09:35:00Z |
      | route-6 | {"trip": "trip-6-0", "booked_at": "2025-01-01T12:42:00Z"} | 2025-01-01T12:42:00Z |
      | route-7 | {"trip": "trip-7-0", "booked_at": "2025-01-01T13:49:00Z"} | 2025-01-01T13:49:00Z |
      | route-7 | {"trip": "trip-7-1", "booked_at": "2025-01-02T06:49:00Z"} | 2025-01-02T06:49:00Z |
      | route-8 | {"trip": "trip-8-0", "booked_at": "2025-01-01T14:56:00Z"} | 2025-01-01T14:56:00Z |
      | route-8 | {"trip": "trip-8-1", "booked_at": "2025-01-02T07:56:00Z"} | 2025-01-02T07:56:00Z |
      | route-8 | {"trip": "trip-8-2", "booked_at": "2025-01-01T12:56:00Z"} | 2025-01-01T12:56:00Z |
      | route-9 | {"trip": "trip-9-0", "booked_at": "2025-01-01T15:03:00Z"} | 2025-01-01T15:03:00Z |
      | route-10 | {"trip": "trip-10-0", "booked_at": "2025-01-01T16:10:00Z"} | 2025-01-01T16:10:00Z |
      | route-10 | {"trip": "trip-10-1", "booked_at": "2025-01-02T09:10:00Z"} | 2025-01-02T09:10:00Z |
      | route-11 | {"trip": "trip-11-0", "booked_at": "2025-01-01T17:17:00Z"} | 2025-01-01T17:17:00Z |
      | route-11 | {"trip": "trip-11-1", "booked_at": "2025-01-02T10:17:00Z"} | 2025-01-02T10:17:00Z |
      | route-11 | {"trip": "trip-11-2", "booked_at": "2025-01-01T15:17:00Z"} | 2025-01-01T15:17:00Z |
      | route-12 | {"trip": "trip-12-0", "booked_at": "2025-01-01T06:24:00Z"} | 2025-01-01T06:24:00Z |
    Then the range of every key in store "bookings" is answered from every instance by its owner
    And the windows of every key in store "trips_per_day" are answered from every instance by its owner

  Scenario: A standby answers ranges and windows within max_lag, and otherwise sends the client to the owner
    When a "java" producer writes these records to "railway.bookings":
      | key | value | timestamp |
      | standby-1 | {"trip": "trip-1-0", "booked_at": "2025-02-01T07:07:00Z"} | 2025-02-01T07:07:00Z |
      | standby-1 | {"trip": "trip-1-1", "booked_at": "2025-02-02T12:07:00Z"} | 2025-02-02T12:07:00Z |
      | standby-2 | {"trip": "trip-2-0", "booked_at": "2025-02-01T08:14:00Z"} | 2025-02-01T08:14:00Z |
      | standby-2 | {"trip": "trip-2-1", "booked_at": "2025-02-02T13:14:00Z"} | 2025-02-02T13:14:00Z |
      | standby-2 | {"trip": "trip-2-2", "booked_at": "2025-02-01T06:14:00Z"} | 2025-02-01T06:14:00Z |
      | standby-3 | {"trip": "trip-3-0", "booked_at": "2025-02-01T09:21:00Z"} | 2025-02-01T09:21:00Z |
    Then a standby of "standby-1" answers its windows in store "trips_per_day" with max_lag 0
    And a standby of "standby-1" answers its range in store "bookings" with max_lag 0
    And without max_lag the standby sends the client to the owner

  @restart
  Scenario: An instance that lost its state directory restores ranges and windows from the changelog
    When a "java" producer writes these records to "railway.bookings":
      | key | value | timestamp |
      | restore-1 | {"trip": "trip-1-0", "booked_at": "2025-03-01T07:07:00Z"} | 2025-03-01T07:07:00Z |
      | restore-1 | {"trip": "trip-1-1", "booked_at": "2025-03-02T12:07:00Z"} | 2025-03-02T12:07:00Z |
      | restore-2 | {"trip": "trip-2-0", "booked_at": "2025-03-01T08:14:00Z"} | 2025-03-01T08:14:00Z |
      | restore-2 | {"trip": "trip-2-1", "booked_at": "2025-03-02T13:14:00Z"} | 2025-03-02T13:14:00Z |
      | restore-2 | {"trip": "trip-2-2", "booked_at": "2025-03-01T06:14:00Z"} | 2025-03-01T06:14:00Z |
      | restore-3 | {"trip": "trip-3-0", "booked_at": "2025-03-01T09:21:00Z"} | 2025-03-01T09:21:00Z |
      | restore-4 | {"trip": "trip-4-0", "booked_at": "2025-03-01T10:28:00Z"} | 2025-03-01T10:28:00Z |
      | restore-4 | {"trip": "trip-4-1", "booked_at": "2025-03-02T15:28:00Z"} | 2025-03-02T15:28:00Z |
      | restore-5 | {"trip": "trip-5-0", "booked_at": "2025-03-01T11:35:00Z"} | 2025-03-01T11:35:00Z |
      | restore-5 | {"trip": "trip-5-1", "booked_at": "2025-03-02T16:35:00Z"} | 2025-03-02T16:35:00Z |
      | restore-5 | {"trip": "trip-5-2", "booked_at": "2025-03-01T09:35:00Z"} | 2025-03-01T09:35:00Z |
      | restore-6 | {"trip": "trip-6-0", "booked_at": "2025-03-01T12:42:00Z"} | 2025-03-01T12:42:00Z |
      | restore-7 | {"trip": "trip-7-0", "booked_at": "2025-03-01T13:49:00Z"} | 2025-03-01T13:49:00Z |
      | restore-7 | {"trip": "trip-7-1", "booked_at": "2025-03-02T06:49:00Z"} | 2025-03-02T06:49:00Z |
      | restore-8 | {"trip": "trip-8-0", "booked_at": "2025-03-01T14:56:00Z"} | 2025-03-01T14:56:00Z |
      | restore-8 | {"trip": "trip-8-1", "booked_at": "2025-03-02T07:56:00Z"} | 2025-03-02T07:56:00Z |
      | restore-8 | {"trip": "trip-8-2", "booked_at": "2025-03-01T12:56:00Z"} | 2025-03-01T12:56:00Z |
      | restore-9 | {"trip": "trip-9-0", "booked_at": "2025-03-01T15:03:00Z"} | 2025-03-01T15:03:00Z |
      | restore-10 | {"trip": "trip-10-0", "booked_at": "2025-03-01T16:10:00Z"} | 2025-03-01T16:10:00Z |
      | restore-10 | {"trip": "trip-10-1", "booked_at": "2025-03-02T09:10:00Z"} | 2025-03-02T09:10:00Z |
      | restore-11 | {"trip": "trip-11-0", "booked_at": "2025-03-01T17:17:00Z"} | 2025-03-01T17:17:00Z |
      | restore-11 | {"trip": "trip-11-1", "booked_at": "2025-03-02T10:17:00Z"} | 2025-03-02T10:17:00Z |
      | restore-11 | {"trip": "trip-11-2", "booked_at": "2025-03-01T15:17:00Z"} | 2025-03-01T15:17:00Z |
      | restore-12 | {"trip": "trip-12-0", "booked_at": "2025-03-01T06:24:00Z"} | 2025-03-01T06:24:00Z |
      | restore-13 | {"trip": "trip-13-0", "booked_at": "2025-03-01T07:31:00Z"} | 2025-03-01T07:31:00Z |
      | restore-13 | {"trip": "trip-13-1", "booked_at": "2025-03-02T12:31:00Z"} | 2025-03-02T12:31:00Z |
      | restore-14 | {"trip": "trip-14-0", "booked_at": "2025-03-01T08:38:00Z"} | 2025-03-01T08:38:00Z |
      | restore-14 | {"trip": "trip-14-1", "booked_at": "2025-03-02T13:38:00Z"} | 2025-03-02T13:38:00Z |
      | restore-14 | {"trip": "trip-14-2", "booked_at": "2025-03-01T06:38:00Z"} | 2025-03-01T06:38:00Z |
      | restore-15 | {"trip": "trip-15-0", "booked_at": "2025-03-01T09:45:00Z"} | 2025-03-01T09:45:00Z |
      | restore-16 | {"trip": "trip-16-0", "booked_at": "2025-03-01T10:52:00Z"} | 2025-03-01T10:52:00Z |
      | restore-16 | {"trip": "trip-16-1", "booked_at": "2025-03-02T15:52:00Z"} | 2025-03-02T15:52:00Z |
      | restore-17 | {"trip": "trip-17-0", "booked_at": "2025-03-01T11:59:00Z"} | 2025-03-01T11:59:00Z |
      | restore-17 | {"trip": "trip-17-1", "booked_at": "2025-03-02T16:59:00Z"} | 2025-03-02T16:59:00Z |
      | restore-17 | {"trip": "trip-17-2", "booked_at": "2025-03-01T09:59:00Z"} | 2025-03-01T09:59:00Z |
      | restore-18 | {"trip": "trip-18-0", "booked_at": "2025-03-01T12:06:00Z"} | 2025-03-01T12:06:00Z |
    Then the range of every key in store "bookings" is answered from every instance by its owner
    When instance 2 restarts with its state directory deleted
    Then it serves the range of its keys in store "bookings", restored from the changelog
    And it serves the windows of its keys in store "trips_per_day", restored from the changelog
    And the store "trips_per_day" holds a plain fold of its topic
