"""Testing a service on real parts: a pytest plugin and a pytest-bdd step library.

``plugin`` gives the fixtures (one embedded broker per session, running instances and clusters
per module) and loads ``steps`` and the other sentences a service's feature files use;
``cluster_plugin`` adds, on request, the sentences about several instances of a service
(``cluster_steps``, ``cluster_checks``, ``failover_checks``). ``kafka`` holds the Kafka helpers
the steps are built on. Sentences only foldstream's own features use live under its
``features/steps/``.
"""
