"""Sentences about the instance under test: which service runs (and on which HTTP server), its
restarts and kills, whether it is ready or gone, and plain ``GET`` answers
(:mod:`foldstream.testing.steps` lists the sentences)."""

from __future__ import annotations

import json

from pytest_bdd import given, parsers, then, when

from foldstream.process import InstanceProcess, http
from foldstream.testing.plugin import InstancePool
from foldstream.testing.scenario import REQUEST_ERRORS, WAIT, wait_until


@given(parsers.parse('the service "{service}" is running'), target_fixture="instance")
def the_service_is_running(instances: InstancePool, service: str) -> InstanceProcess:
    return instances.get(service)


@given(parsers.parse('the service "{service}" is running on {server}'), target_fixture="instance")
def the_service_is_running_on(
    instances: InstancePool, service: str, server: str
) -> InstanceProcess:
    """``server`` is the HTTP server of ``foldstream serve --server``: uvicorn or granian."""
    return instances.get(service, server)


@when("the instance is restarted")
def restart(instance: InstanceProcess) -> None:
    instance.start()
    instance.wait_ready()


@when("the instance's own process is killed with kill -9")
def kill_server_process(instance: InstanceProcess) -> None:
    """SIGKILL the ``foldstream serve`` process alone (not its process group)."""
    assert instance.process is not None, "the instance is not running"
    instance.process.kill()
    instance.process.wait()


@then("nothing of the instance answers any more")
def instance_gone(instance: InstanceProcess) -> None:
    """No orphan (e.g. an HTTP server's worker process) goes on serving the instance's port."""

    def gone() -> bool:
        try:
            http("GET", f"{instance.url}/health")
        except REQUEST_ERRORS:
            return True
        return False

    wait_until(gone, lambda: f"{instance.url} still answers after its process was killed")


@then("the instance becomes ready")
def becomes_ready(instance: InstanceProcess) -> None:
    """``GET /ready`` answers 200: every store has caught up with its topic."""
    instance.wait_ready(timeout=WAIT)


@then(parsers.parse('GET "{path}" answers {status:d} with {body}'))
def get_answers_with(instance: InstanceProcess, path: str, status: int, body: str) -> None:
    assert http("GET", f"{instance.url}{path}") == (status, json.loads(body))
