@ordered
Feature: Ordered stores: a customer's bookings between two times
  The railway bookings example reads a topic another producer writes (9 partitions, keyed by
  customer, murmur2). Its store "bookings" keeps every booking under its customer, ordered by
  booked_at; a range read answers a customer's bookings between two times (from inclusive, to
  exclusive), a page at a time. Bookings at the same time are all kept, in the order written.
  Its store "trips_per_day" counts each customer's bookings per day of the records' timestamps
  (each bookings feature starts on empty topics: no other feature's records make these late).

  Background:
    Given the topic "railway.bookings" has 9 partitions
    And the service "foldstream.examples.bookings:service" is running

  Scenario: A customer's bookings between two times, in booked_at order
    When a "java" producer writes these records to "railway.bookings":
      | key    | value                                                        | timestamp            |
      | cust-1 | {"trip": "Paris-Lyon", "booked_at": "2024-05-01T09:30:00Z"}  | 2024-05-01T09:30:00Z |
      | cust-1 | {"trip": "Lyon-Nice", "booked_at": "2024-05-01T08:15:00Z"}   | 2024-05-01T09:31:00Z |
      | cust-2 | {"trip": "Lille-Paris", "booked_at": "2024-05-01T08:20:00Z"} | 2024-05-01T09:32:00Z |
      | cust-1 | {"trip": "Nice-Paris", "booked_at": "2024-05-01T12:00:00Z"}  | 2024-05-01T12:00:00Z |
      | cust-1 | {"trip": "Paris-Lille", "booked_at": "2024-05-01T08:15:00Z"} | 2024-05-01T12:01:00Z |
      | cust-1 | {"trip": "Lille-Lyon", "booked_at": "2024-05-01T07:59:59Z"}  | 2024-05-02T07:00:00Z |
    Then every record landed in the partition the "murmur2" partitioner gives its key
    And the range of "cust-1" in store "bookings" from "2024-05-01T08:15:00Z" to "2024-05-01T12:00:00Z" holds:
      | sort_key                 | value                                                        |
      | 2024-05-01T08:15:00.000Z | {"trip": "Lyon-Nice", "booked_at": "2024-05-01T08:15:00Z"}   |
      | 2024-05-01T08:15:00.000Z | {"trip": "Paris-Lille", "booked_at": "2024-05-01T08:15:00Z"} |
      | 2024-05-01T09:30:00.000Z | {"trip": "Paris-Lyon", "booked_at": "2024-05-01T09:30:00Z"}  |
    And the store "latest_booking" returns {"trip": "Lille-Lyon", "booked_at": "2024-05-01T07:59:59Z"} for "cust-1"
    And the windows of "cust-1" in store "trips_per_day" are:
      | start                    | end                      | value           |
      | 2024-05-01T00:00:00.000Z | 2024-05-02T00:00:00.000Z | {"bookings": 4} |
      | 2024-05-02T00:00:00.000Z | 2024-05-03T00:00:00.000Z | {"bookings": 1} |
    And the store "bookings" holds a plain fold of its topic
    And the store "trips_per_day" holds a plain fold of its topic
    And foldstream's client reads the same windows of "cust-1" in store "trips_per_day"

  Scenario: Pages of a range hold every entry once, in order
    When a "java" producer writes 130 bookings of customer "pager-1" to "railway.bookings"
    Then reading the range of "pager-1" in store "bookings" 40 at a time gives each entry once, in order
    And the range of "pager-1" in store "bookings" refuses its own cursor sent with from "2100-01-01T00:00:00Z"
    And foldstream's client reads the entries of "pager-1" in store "bookings" from noon, 40 at a time

  Scenario: A tombstone deletes every booking of its customer
    When a "java" producer writes these records to "railway.bookings":
      | key       | value                                                       |
      | forget-me | {"trip": "Paris-Lyon", "booked_at": "2024-05-01T09:30:00Z"} |
      | forget-me | {"trip": "Lyon-Nice", "booked_at": "2024-05-01T10:30:00Z"}  |
      | forget-me |                                                             |
      | forget-me | {"trip": "Nice-Lyon", "booked_at": "2024-05-03T10:30:00Z"}  |
    Then the range of "forget-me" in store "bookings" holds:
      | sort_key                 | value                                                      |
      | 2024-05-03T10:30:00.000Z | {"trip": "Nice-Lyon", "booked_at": "2024-05-03T10:30:00Z"} |

  Scenario Outline: A range read with bad parameters, or of a store that is not ordered, gets 400
    Then GET "<path>" answers 400 saying "<reason>"

    Examples:
      | path                                                           | reason                                  |
      | /stores/bookings/keys/cust-1/range?from=yesterday              | from must be a time sort key            |
      | /stores/bookings/keys/cust-1/range?to=2024-05-01T10:00:00+02:00 | to must be a time sort key             |
      | /stores/bookings/keys/cust-1/range?from=2024-05-02&to=2024-05-01 | is after to                           |
      | /stores/bookings/keys/cust-1/range?limit=0                     | limit must be an integer from 1 to 1000 |
      | /stores/bookings/keys/cust-1/range?limit=1001                  | limit must be an integer from 1 to 1000 |
      | /stores/bookings/keys/cust-1/range?after=not-a-cursor          | after is not a cursor of this store     |
      | /stores/bookings/keys/cust-1/range?from=%FF                    | from is not valid UTF-8                 |
      | /stores/latest_booking/keys/cust-1/range                       | is not ordered but point                |
      | /stores/bookings/keys/cust-1/windows                           | is not windowed but ordered             |
      | /stores/bookings/keys/cust-1                                   | is not point but ordered                |
