@commands
Feature: Commands append events, or are rejected and append nothing
  A command runs against the aggregate's current state. Its events are appended to the events
  topic, in the partition of the aggregate's id, before the command is answered.

  Scenario: A command answers with the events it appended
    When product "cmd-1" is sent "receive_shipment" with {"quantity": 10}
    Then the command appended these events:
      | type                     | data             |
      | Product.Created          | {}               |
      | Product.ShipmentReceived | {"quantity": 10} |
    When product "cmd-1" is sent "sell" with {"quantity": 4}
    Then the command appended these events:
      | type              | data            |
      | Product.ItemsSold | {"quantity": 4} |
    And the store "stock" returns {"on_hand": 6} for "cmd-1"

  Scenario: A command sees the events of the commands before it
    Given product "cmd-2" accepted "receive_shipment" with {"quantity": 3}
    When product "cmd-2" is sent "sell" with {"quantity": 4}
    Then the command is rejected with status 422 saying "only 3 on hand"
    And nothing was appended
    And the store "stock" returns {"on_hand": 3} for "cmd-2"

  Scenario: A command resent with its Idempotency-Key answers its first outcome and appends nothing more
    When product "idem-1" is sent "receive_shipment" under Idempotency-Key "k-idem-1" with {"quantity": 2}
    Then the command appended these events:
      | type                     | data            |
      | Product.Created          | {}              |
      | Product.ShipmentReceived | {"quantity": 2} |
    When product "idem-1" is sent "receive_shipment" under Idempotency-Key "k-idem-1" with {"quantity": 2}
    Then the answer is the first one under Idempotency-Key "k-idem-1", marked replayed
    And nothing was appended
    When product "idem-1" is sent "receive_shipment" under Idempotency-Key "k-idem-1" with {"quantity": 3}
    Then the command is rejected with status 422 saying "Idempotency-Key 'k-idem-1' was used for"
    And nothing was appended
    When product "idem-1" is sent "sell" under Idempotency-Key "k-idem-2" with {"quantity": 5}
    Then the command is rejected with status 422 saying "only 2 on hand"
    When product "idem-1" is sent "receive_shipment" under Idempotency-Key "k-idem-3" with {"quantity": 3}
    And product "idem-1" is sent "sell" under Idempotency-Key "k-idem-2" with {"quantity": 5}
    Then the command appended these events:
      | type              | data            |
      | Product.ItemsSold | {"quantity": 5} |
    And the store "stock" returns {"on_hand": 0} for "idem-1"

  Scenario: A command with an Idempotency-Key that is no key is refused
    When product "idem-bad" is sent "receive_shipment" under Idempotency-Key "no spaces" with {"quantity": 1}
    Then the command is rejected with status 400 saying "is not a key"
    And nothing was appended

  Scenario Outline: A bad command gets its 4xx and appends nothing
    When <aggregate> "bad-1" is sent "<command>" with <body>
    Then the command is rejected with status <status> saying "<reason>"
    And nothing was appended

    Examples:
      | aggregate | command          | body                | status | reason                   |
      | product   | sell             | {"quantity": 5}     | 422    | only 0 on hand           |
      | product   | receive_shipment | {"quantity": 0}     | 422    | at least one item        |
      | product   | launch           | {}                  | 404    | no command 'launch'      |
      | warehouse | sell             | {"quantity": 1}     | 404    | no aggregate 'warehouse' |
      | product   | sell             | {not json           | 400    | malformed JSON           |
      | product   | sell             | [1]                 | 400    | JSON object              |
      | product   | sell             | {"qty": 1}          | 400    | qty                      |
      | product   | sell             | {"quantity": "two"} | 400    | must be int              |
      | product   | sell             | {"quantity": true}  | 400    | must be int              |
      | product   | sell             | {}                  | 400    | quantity                 |

  Scenario Outline: A query parameter a command does not take is refused, never ignored
    A misspelt expected_version used to be ignored: the command ran without its version check.

    Given product "<id>" accepted "receive_shipment" with {"quantity": 5}
    When product "<id>" is sent "sell" with {"quantity": 5} and the query "<query>"
    Then the command is rejected with status 400 saying "<reason>"
    And nothing was appended
    And the store "stock" returns {"on_hand": 5} for "<id>"

    Examples:
      | id      | query                        | reason                                                                                                                                                                  |
      | param-1 | expected_versoin=1           | unknown query parameter(s) of POST /commands/{aggregate}/{id}/{command}: 'expected_versoin' (did you mean 'expected_version'?); this route takes expected_version, hops |
      | param-2 | expected_version=1&max_lag=0 | unknown query parameter(s) of POST /commands/{aggregate}/{id}/{command}: 'max_lag'                                                                                       |
      | param-3 | ExpectedVersion=1            | 'ExpectedVersion'                                                                                                                                                        |
