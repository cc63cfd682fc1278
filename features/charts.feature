@rekeying
Feature: Music charts: a store re-keyed by genre from another store's changes (chained stores)
  ``song_plays`` folds each song's events; ``top5`` groups its values by genre with an adder and
  a subtractor, through its repartition topic: exactly once across both stages, and equal to a
  plain-Python computation of the whole graph from the topics.

  Scenario: A play moves a song within its genre's top 5, and another song out of it
    Given the service "foldstream.examples.charts:service" is running
    And song "hit-1" accepted "register" with {"title": "One", "artist": "A", "genre": "jazz"}
    And song "hit-2" accepted "register" with {"title": "Two", "artist": "B", "genre": "jazz"}
    And song "hit-3" accepted "register" with {"title": "Three", "artist": "C", "genre": "jazz"}
    And song "hit-4" accepted "register" with {"title": "Four", "artist": "D", "genre": "jazz"}
    And song "hit-5" accepted "register" with {"title": "Five", "artist": "E", "genre": "jazz"}
    And song "hit-6" accepted "register" with {"title": "Six", "artist": "F", "genre": "jazz"}
    And song "hit-6" accepted "play" with {}
    Then the store "top5" returns {"genre": "jazz", "top": [{"song": "hit-6", "title": "Six", "plays": 1}, {"song": "hit-1", "title": "One", "plays": 0}, {"song": "hit-2", "title": "Two", "plays": 0}, {"song": "hit-3", "title": "Three", "plays": 0}, {"song": "hit-4", "title": "Four", "plays": 0}]} for "jazz"
    And the store "song_plays" returns {"song": "hit-6", "title": "Six", "genre": "jazz", "plays": 1} for "hit-6"
    When song "hit-1" is sent "register" with {"title": "Again", "artist": "A", "genre": "pop"}
    Then the command is rejected with status 422 saying "song hit-1 is already registered"
    When song "nobody" is sent "play" with {}
    Then the command is rejected with status 422 saying "song nobody is not registered"

  Scenario: Random plays: every store equals the computation from the topics
    Given the service "foldstream.examples.charts:service" is running
    When 150 random commands of the demo are sent through the instances in turn
    Then every store of the service answers what a plain-Python computation of its topics gives
    And every copy of every store holds what a plain-Python computation of its topics gives
