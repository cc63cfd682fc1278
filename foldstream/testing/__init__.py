"""Testing a service on real parts: a pytest plugin and a pytest-bdd step library.

``plugin`` gives the fixtures (one embedded broker per session, running instances and clusters
per module) and loads ``steps`` and ``cluster_steps``, the Given/When/Then sentences that feature
files of the framework and of generated services share. ``kafka`` holds the Kafka helpers the
steps are built on.
"""
