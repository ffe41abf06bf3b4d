"""GPU worker pods get NCCL socket settings for TCP pod networks; `--env`/`--secret-env` of the
same name wins; the head and CPU pods get none (submitter.contract.pod_network). The Helm chart
renders the same env (PARITY cases "nccl-*" in test_helm_chart.py)."""

from __future__ import annotations

from submitter.contract.pod_network import NCCL_SOCKET_ENV, worker_env
from submitter.contract.spec import JobSpec
from submitter.render import render


def _containers(**kw) -> dict[str, list[dict]]:
    rayjob = next(o for o in render(JobSpec.build(kw)).objects if o["kind"] == "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    return {"head": cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"],
            "worker": cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]}


def _plain(env: list[dict]) -> dict[str, str]:
    return {e["name"]: e.get("value", "secret") for e in env}


def test_gpu_workers_get_the_nccl_socket_settings_and_the_head_does_not():
    env = _containers(name="j", replicas=8, gpu_per_pod=1)
    worker = _plain(env["worker"])
    assert {k: worker[k] for k in NCCL_SOCKET_ENV} == {"NCCL_NSOCKS_PERTHREAD": "4",
                                                        "NCCL_SOCKET_NTHREADS": "4"}
    assert not any(k.startswith("NCCL_") for k in _plain(env["head"]))
    # NCCL's limit: threads x sockets per thread <= 64
    assert int(worker["NCCL_SOCKET_NTHREADS"]) * int(worker["NCCL_NSOCKS_PERTHREAD"]) <= 64


def test_cpu_workers_get_no_nccl_settings():
    assert not any(k.startswith("NCCL_") for k in _plain(_containers(name="j")["worker"]))


def test_the_users_env_overrides_a_setting_and_keeps_the_other():
    worker = _plain(_containers(name="j", gpu_per_pod=1,
                                env={"NCCL_SOCKET_NTHREADS": "8"})["worker"])
    assert worker["NCCL_SOCKET_NTHREADS"] == "8" and worker["NCCL_NSOCKS_PERTHREAD"] == "4"


def test_a_secret_env_of_the_same_name_wins_and_is_not_duplicated():
    env = _containers(name="j", gpu_per_pod=1,
                      secret_env={"NCCL_NSOCKS_PERTHREAD": "nccl:socks"})["worker"]
    names = [e["name"] for e in env]
    assert names.count("NCCL_NSOCKS_PERTHREAD") == 1
    assert next(e for e in env if e["name"] == "NCCL_NSOCKS_PERTHREAD")["valueFrom"]


def test_worker_env_is_the_users_env_plus_the_defaults_it_does_not_set():
    assert worker_env(0, {"A": "1"}) == {"A": "1"}
    assert worker_env(1, {"A": "1"}) == {"A": "1", **NCCL_SOCKET_ENV}
    assert worker_env(1, {}, {"NCCL_SOCKET_NTHREADS": "s:k"}) == {"NCCL_NSOCKS_PERTHREAD": "4"}
