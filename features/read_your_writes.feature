@consistency
Feature: Read-your-writes: a query with a command's token sees that command
  A command's answer carries a consistency token, the position of its last event. A lookup or
  a batch lookup that sends it back (?consistent_with=TOKEN, or the header Foldstream-Consistent-With) is answered
  only with state that includes that command: the copy it reads is awaited a bounded time
  (consistency_wait_ms), then the answer is 503 with Retry-After. Never an older answer.

  Scenario: The first lookup with a command's token answers the state after that command
    When product "ryw-1" is sent "receive_shipment" with {"quantity": 7}
    Then the command's answer carries a consistency token
    And looking up "ryw-1" in store "stock" after the command answers {"on_hand": 7}
    When product "ryw-1" is sent "sell" with {"quantity": 3}
    Then looking up "ryw-1" in store "stock" after the command answers {"on_hand": 4}
    When product "ryw-1" is sent "sell" with {"quantity": 1}
    Then looking up "ryw-1" in store "stock" with the command's token in the header answers {"on_hand": 3}

  Scenario: A batch lookup with a command's token answers the state after that command
    When product "ryw-2" is sent "receive_shipment" with {"quantity": 5}
    Then a batch lookup of "ryw-2" and "ryw-none" in store "stock" after the command answers {"on_hand": 5} for "ryw-2"

  Scenario Outline: A token that is not one is refused with 400
    Then looking up "ryw-1" in store "stock" with the token <token> answers 400 saying "<reason>"

    Examples:
      | token                          | reason                      |
      | "garbage"                      | not a consistency token     |
      | "f1-0-12-00000000"             | no position of              |
      | of the topic "other.events"    | no position of              |

  Scenario: A token the store's copy does not reach in time answers 503 with Retry-After
    Then looking up "ryw-far" in store "stock" with a token far past the end of its partition answers 503 with Retry-After
