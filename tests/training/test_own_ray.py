"""training.run.own_ray: a Ray process pins RAY_ADDRESS to its own GCS, keeps one set for it."""

from __future__ import annotations

from types import SimpleNamespace

from training.run.own_ray import pin_address


def _ray(address):
    def context():
        if address is None:
            raise RuntimeError("Ray has not been started yet")
        return SimpleNamespace(gcs_address=address)
    return SimpleNamespace(get_runtime_context=context)


def test_a_worker_pins_its_own_gcs():
    env: dict[str, str] = {}
    pin_address(env, _ray("10.0.0.5:6379"))
    assert env == {"RAY_ADDRESS": "10.0.0.5:6379"}


def test_an_address_set_for_the_process_is_kept():
    env = {"RAY_ADDRESS": "head-svc:6379"}  # a pod's: the RayJob's cluster
    pin_address(env, _ray("10.0.0.5:6379"))
    assert env == {"RAY_ADDRESS": "head-svc:6379"}


def test_an_unconnected_process_changes_nothing():
    env: dict[str, str] = {}
    pin_address(env, _ray(None))
    assert env == {}
    pin_address(env, _ray(""))
    assert env == {}
