"""Sentences only this repository's features use (a projection failing on purpose, an owner
paused mid-fold), loaded by its root ``conftest.py``; services get theirs from
:mod:`foldstream.testing`."""
