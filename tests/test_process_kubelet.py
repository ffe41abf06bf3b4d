"""The process kubelet's pure parts (tests/support/kubelet), fast and without root: what its DNS
answers, how it builds a container's environment, how it shows logs, when a probe trips. The
whole kubelet runs in the realcluster tests."""

from __future__ import annotations

import socket
import struct

import pytest

from tests.support.kubelet.dns import answer, parse_question, service_records
from tests.support.kubelet.env import ConfigError, container_env, expand, field_value, resource_value
from tests.support.kubelet.node import _shown
from tests.support.kubelet.pod import Probe


def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


def records(response: bytes) -> tuple[int, list[str]]:
    """(rcode, the A records' addresses) of a response to `query`."""
    _, flags, _, ancount, _, _ = struct.unpack("!HHHHHH", response[:12])
    at = 12
    while response[at]:
        at += response[at] + 1
    at += 5
    out = []
    for _ in range(ancount):
        _, rtype, _, _, length = struct.unpack("!HHHIH", response[at:at + 12])
        out.append(socket.inet_ntoa(response[at + 12:at + 12 + length]))
        at += 12 + length
    return flags & 0xF, out


SERVICES = [{"metadata": {"name": "job-head-svc", "namespace": "ml"}},
            {"metadata": {"name": "empty", "namespace": "ml"}}]
SLICES = [{"metadata": {"namespace": "ml", "labels": {"kubernetes.io/service-name": "job-head-svc"}},
           "endpoints": [{"addresses": ["10.244.3.5"], "conditions": {"ready": True}},
                         {"addresses": ["10.244.3.9"], "conditions": {"ready": False}},
                         {"addresses": ["10.244.3.7"]}]}]


def test_a_service_resolves_to_its_ready_endpoints():
    table = service_records(SERVICES, SLICES, "cluster.local")
    assert table == {"job-head-svc.ml.svc.cluster.local": ["10.244.3.5", "10.244.3.7"],
                     "empty.ml.svc.cluster.local": []}
    rcode, addresses = records(answer(query("Job-Head-Svc.ml.svc.cluster.local"), table.get))
    assert rcode == 0 and addresses == ["10.244.3.5", "10.244.3.7"]  # names are case-blind


def test_other_names_are_nxdomain_and_other_types_nodata():
    table = service_records(SERVICES, SLICES, "cluster.local")
    assert records(answer(query("job-head-svc.ml.svc.cluster.local.ml.svc.cluster.local"), table.get)) == (3, [])
    assert records(answer(query("pypi.org"), table.get)) == (3, [])  # no upstream: nothing outside
    assert records(answer(query("job-head-svc.ml.svc.cluster.local", qtype=28), table.get)) == (0, [])
    response = answer(query("x", ident=0xBEEF), table.get)
    assert response[:2] == b"\xbe\xef" and response[2] & 0x80  # the query's id, a response


def test_a_malformed_query_gets_no_answer():
    assert parse_question(b"\x00\x01") is None
    assert answer(query("a.b")[:-3], {}.get) is None


POD = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-1", "labels": {"app": "x"}},
       "spec": {"nodeName": "n", "serviceAccountName": "sa"}, "status": {"podIP": "10.244.3.5"}}


class Sources:
    def __init__(self, data: dict) -> None:
        self.data_ = data
        self.namespace = "ml"

    def data(self, kind: str, name: str, optional: bool = False):
        if (kind, name) not in self.data_:
            if optional:
                return None
            raise ConfigError(f'{kind[:-1]} "{name}" not found')
        return self.data_[(kind, name)]


def test_env_as_kubelet_builds_it():
    container = {"resources": {"limits": {"cpu": "1500m", "memory": "2Gi"}},
                 "envFrom": [{"secretRef": {"name": "s3"}, "prefix": "X_"}],
                 "env": [{"name": "A", "value": "a"},
                         {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"},
                         {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                         {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                         {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                            "divisor": "1Mi"}}},
                         {"name": "KEY", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                         {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k",
                                                                        "optional": True}}}]}
    sources = Sources({("secrets", "s3"): {"ID": "i"}, ("configmaps", "cm"): {"k": "v"}})
    env = container_env(POD, container, sources, {"PATH": "/bin"}, {"cpu": "32"})
    assert env == {"PATH": "/bin", "X_ID": "i", "A": "a", "B": "a-$(NOPE)-$(A)", "IP": "10.244.3.5",
                   "APP": "x", "CPU": "2", "MEM": "2048", "KEY": "v"}


def test_a_missing_secret_is_a_config_error_and_an_unset_limit_the_nodes():
    with pytest.raises(ConfigError, match='secret "nope" not found'):
        container_env(POD, {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]},
                      Sources({}), {}, {})
    assert resource_value({}, {"resource": "limits.cpu"}, {"cpu": "32"}) == "32"
    assert field_value(POD, "spec.serviceAccountName") == "sa"
    assert expand("$(A) $$ $(B)", {"A": "1"}) == "1 $ $(B)"


def test_logs_are_shown_as_the_api_hands_them_out():
    line = b"2026-11-28T07:00:00.123456Z stdout F hello world\n"
    assert _shown(line, False) == b"hello world\n"
    assert _shown(line, True) == b"2026-11-28T07:00:00.123456Z hello world\n"
    assert _shown(b"2026-11-28T07:00:00.1Z stdout P no newline yet\n", False) == b"no newline yet"


def test_a_probe_trips_at_its_thresholds():
    probe = Probe({"failureThreshold": 2, "successThreshold": 2, "periodSeconds": 5}, "readiness")
    assert [probe.record(ok) for ok in (False, False, True, True, False)] == \
        [None, "failure", None, "success", None]
    assert probe.due(started=0.0) and not probe.due(started=0.0)  # then not before periodSeconds
