@poison
Feature: Poison records never stall a store
  Anyone may write to the topics a service reads. A record a projection cannot fold (not an
  event of the service, an event type naming any other module, a number too large to encode)
  is dead-lettered by default: the store moves on and the key keeps its value, every partition
  keeps folding, and the record waits in <service>.<store>.dlq with what went wrong and where
  it came from. Resolving an event type never imports anything. The command side skips what
  it cannot replay; only the aggregate it could not replay refuses commands.

  Background:
    Given the topic "poisoned.notes" has 2 partitions
    And the service "foldstream.testing.poisoned:service" is running
    And the instance's metrics were read

  Scenario Outline: A record that is no event of the service is dead-lettered and every partition folds on
    When a "<kind>" record with key "<key>" is written to the events topic
    Then store "stock" dead-lettered the record with key "<key>" saying "<error>"
    And its metrics count 1 more record of store "stock" dead-lettered
    And commands on every partition still fold into store "stock"
    And the instance becomes ready

    Examples:
      | kind            | key          | error                                             |
      | garbage         | garbage-1    | UndecodableRecord: record with key b'garbage-1' is not a foldstream event |
      | headerless      | headerless-1 | is not a foldstream event                         |
      | os-system       | os-1         | unknown event type 'os:system'                    |
      | foreign-module  | smtp-1       | unknown event type 'smtplib:SMTP'                 |
      | huge-number     | huge-1       | Exceeds the limit (4300 digits)                   |
      | forged-creation | forged-1     | names the aggregate class 'os:system'             |

  Scenario: A sum too large to encode is dead-lettered and the key keeps its value
    When another producer appends two "ShipmentReceived" events with a 4300-digit "quantity" to product "big"
    Then store "stock" dead-lettered the record with key "big" saying "Exceeds the limit (4300 digits)"
    And its metrics count 1 more record of store "stock" dead-lettered
    And the store "stock" returns the 4300-digit "on_hand" of the first event for "big"
    And commands on every partition still fold into store "stock"

  Scenario: A record of a queryable topic that cannot be folded is dead-lettered
    When a record without a key is written to "poisoned.notes"
    And a record with key "deep" of "poisoned.notes" holds JSON nested 100000 levels deep
    And a record with key "deep" of "poisoned.notes" has the value {"text": "after"}
    Then store "notes" dead-lettered the record without a key saying "a record without a key cannot be folded"
    And the store "notes" returns {"text": "after"} for "deep"
    And its metrics count 2 more records of store "notes" dead-lettered
    And the instance becomes ready

  @restart
  Scenario: The command side skips what it cannot replay and only that aggregate refuses commands
    Given product "sku-fine" accepted "receive_shipment" with {"quantity": 2}
    When a "os-system" record with key "sku-forged" is written to the events topic
    And a "garbage" record with key "sku-junk" is written to the events topic
    And the instance is stopped and started again
    Then product "sku-forged" refuses "receive_shipment" with {"quantity": 1}, naming the record it could not replay
    And product "sku-fine" still takes "receive_shipment" with {"quantity": 1}
    And product "sku-junk" still takes "receive_shipment" with {"quantity": 1}
    And the store "stock" returns {"on_hand": 3} for "sku-fine"
    And the instance's replays skipped at least 2 records
    And commands on every partition still fold into store "stock"
