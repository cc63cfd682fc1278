"""Music charts: the top 5 songs of each genre by plays, the example Kafka Streams' Interactive
Queries were announced with, as a chained store (``foldstream.examples.charts:service``).

``song_plays`` folds each song's events (keyed by song id); ``top5`` groups its values by genre
with an adder and a subtractor (Kafka Streams' ``KTable.groupBy(...).aggregate(...)``): a play
moves a song within its genre's chart, and a song overtaking the fifth pushes it out.

Each chart keeps only its top 5, which is right because a song's plays only ever grow and its
genre never changes: a song leaves a chart only when another overtakes it, and can only come
back by being played, which adds it again. (A chart whose entries could shrink or move
would keep every song of the genre instead.)
"""

from __future__ import annotations

from typing import Any

from foldstream.domain import Aggregate, DomainRuleViolation, command, event
from foldstream.projections import Aggregation, EventProjection
from foldstream.service import Service

TOP = 5


class Song(Aggregate):
    """A song; its id is the catalogue's."""

    def __init__(self, id: str) -> None:  # noqa: A002 - eventsourcing's name for the id
        self.genre: str | None = None
        self.plays = 0

    @command
    def register(self, title: str, artist: str, genre: str) -> None:
        """Put the song in the catalogue, in ``genre``; rejected when it is there already."""
        if self.genre is not None:
            raise DomainRuleViolation(f"song {self.id} is already registered")
        if not genre:
            raise DomainRuleViolation("a song's genre must not be empty")
        self._registered(title, artist, genre)

    @command
    def play(self) -> None:
        """Count one play; rejected for a song not in the catalogue."""
        if self.genre is None:
            raise DomainRuleViolation(f"song {self.id} is not registered")
        self._played()

    @event("Registered")
    def _registered(self, title: str, artist: str, genre: str) -> None:
        self.genre = genre

    @event("Played")
    def _played(self) -> None:
        self.plays += 1


def fold_song(state: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """``song_plays``: a registered song's title, genre and plays."""
    if isinstance(event, Song.Registered):
        song = event.originator_id
        return {"song": song, "title": event.title, "genre": event.genre, "plays": 0}
    if isinstance(event, Song.Played) and state is not None:
        return {**state, "plays": state["plays"] + 1}
    return state


def genre_of(song_id: str, song: dict[str, Any]) -> str:
    return str(song["genre"])


def _rank(entry: dict[str, Any]) -> tuple[int, str]:
    return -entry["plays"], entry["song"]  # plays descending, ties by song id


def add_to_chart(chart: dict[str, Any] | None, song_id: str, song: dict[str, Any]) -> Any:
    """``top5``'s adder: the song enters its genre's chart (if it ranks in the top 5)."""
    top = [e for e in (chart or {"top": []})["top"] if e["song"] != song_id]
    top.append({"song": song_id, "title": song["title"], "plays": song["plays"]})
    top.sort(key=_rank)
    return {"genre": song["genre"], "top": top[:TOP]}


def remove_from_chart(chart: dict[str, Any] | None, song_id: str, song: dict[str, Any]) -> Any:
    """``top5``'s subtractor: the song leaves its genre's chart (a chart left empty goes)."""
    if chart is None:
        return None
    top = [e for e in chart["top"] if e["song"] != song_id]
    return {"genre": chart["genre"], "top": top} if top else None


service = Service(
    name="charts",
    aggregates={"song": Song},
    projections=[
        EventProjection("song_plays", fold_song),
        Aggregation(
            "top5",
            source="song_plays",
            group_by=genre_of,
            add=add_to_chart,
            subtract=remove_from_chart,
        ),
    ],
)
