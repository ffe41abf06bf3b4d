"""What the rendered NetworkPolicy admits (tests/support/netpol.py evaluates it as the
NetworkPolicy API defines it): the job's pods, the KubeRay operator by a settable selector, the
metrics scraper on 8080, and the API server's address block for a proxied operator."""

from __future__ import annotations

import pytest

from submitter.cli import main
from submitter.contract.spec import JobSpec
from submitter.render import render
from tests.support.netpol import Peer, admits, admitted_ports

JOB = {"submitter.dev/job": "gpt2-demo"}
RAY_PORTS = (6379, 8080, 8265, 10001, 52365)
OPERATOR = Peer("kuberay-system", {"kubernetes.io/metadata.name": "kuberay-system"},
                {"app.kubernetes.io/component": "kuberay-operator", "app.kubernetes.io/name": "kuberay-operator"})
PROMETHEUS = Peer("monitoring", {"kubernetes.io/metadata.name": "monitoring"},
                  {"app.kubernetes.io/name": "prometheus", "prometheus": "kube-prometheus"})
NEIGHBOUR = Peer("default", {}, {"app": "web"})
API_SERVER = Peer(ip="172.16.0.2")  # a control plane outside the pod network (GKE, EKS)


def policy(**settings):
    plan = render(JobSpec.build(name="gpt2-demo", **settings))
    return next(o for o in plan if o["kind"] == "NetworkPolicy")


def ports(pol, peer):
    return admitted_ports(pol, peer, RAY_PORTS)


def test_the_default_policy_admits_the_job_the_operator_to_8265_and_prometheus_to_8080():
    pol = policy()
    assert ports(pol, Peer("default", {}, dict(JOB))) == set(RAY_PORTS)
    assert ports(pol, Peer("default", {}, {**JOB, "extra": "x"})) == set(RAY_PORTS)
    assert ports(pol, OPERATOR) == {8265}
    assert ports(pol, PROMETHEUS) == {8080}
    assert ports(pol, NEIGHBOUR) == set()
    assert ports(pol, Peer("other", {}, dict(JOB))) == set()  # the job label from another namespace
    assert ports(pol, API_SERVER) == set()
    # pods the policy does not select are none of its business
    assert admits(pol, NEIGHBOUR, 6379, target_labels={"app": "db"})


def test_a_settable_operator_selector_replaces_the_default_one():
    pol = policy(operator_selector="app=ray-operator,team=platform")
    custom = Peer("ray", {}, {"app": "ray-operator", "team": "platform"})
    assert ports(pol, custom) == {8265}
    assert ports(pol, Peer("ray", {}, {"app": "ray-operator"})) == set()  # both labels needed
    assert ports(pol, OPERATOR) == set()


def test_the_metrics_selector_admits_its_scraper_to_8080_only_and_empty_admits_none():
    vm = Peer("monitoring", {}, {"app.kubernetes.io/name": "vmagent"})
    pol = policy(metrics_selector="app.kubernetes.io/name=vmagent")
    assert ports(pol, vm) == {8080} and ports(pol, PROMETHEUS) == set()
    closed = policy(metrics_selector="")
    assert ports(closed, PROMETHEUS) == set() and ports(closed, OPERATOR) == {8265}


def test_a_kubernetes_proxy_operator_is_admitted_by_the_api_servers_address_block():
    """--use-kubernetes-proxy: the operator reaches the dashboard through the API server, so
    the packets come from its address; only the dashboard port opens to it."""
    pol = policy(dashboard_cidr=["172.16.0.0/28"])
    assert ports(pol, API_SERVER) == {8265}
    assert ports(pol, Peer(ip="172.16.0.17")) == set()
    assert ports(pol, Peer(ip="10.1.2.3")) == set()
    anywhere = policy(dashboard_cidr=["0.0.0.0/0"])
    assert ports(anywhere, Peer(ip="203.0.113.9")) == {8265}
    assert ports(anywhere, NEIGHBOUR) == set()  # ipBlock is for outside traffic; pods use selectors
    assert ports(policy(dashboard_cidr=["2001:db8::/32"]), Peer(ip="2001:db8::1")) == {8265}


def test_the_evaluator_follows_the_api_rules():
    pol = {"metadata": {"namespace": "a"}, "spec": {
        "podSelector": {}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod"]}]}}], "ports": [{"port": 8000, "endPort": 8010}]},
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}}]},
            {"from": [{"podSelector": {"matchLabels": {"x": "1"}}}]}]}}
    assert admits(pol, Peer("b", {"env": "prod"}, {}), 8005, target_labels={})
    assert not admits(pol, Peer("b", {"env": "dev"}, {}), 8005, target_labels={})
    assert not admits(pol, Peer("b", {"env": "prod"}, {}), 8011, target_labels={})
    assert admits(pol, Peer(ip="10.1.0.1"), 1, target_labels={})
    assert not admits(pol, Peer(ip="10.9.0.1"), 1, target_labels={})
    assert admits(pol, Peer("a", {}, {"x": "1"}), 5, target_labels={})
    assert not admits(pol, Peer("c", {}, {"x": "1"}), 5, target_labels={})  # podSelector alone: own namespace
    assert admits({"spec": {"podSelector": {}, "policyTypes": ["Egress"]}}, NEIGHBOUR, 1, target_labels={})


@pytest.mark.parametrize("flag, value", [
    ("--operator-selector", ""), ("--operator-selector", "app"), ("--operator-selector", "a b=c"),
    ("--metrics-selector", "a=b,"), ("--metrics-selector", "=x"),
    ("--dashboard-cidr", "10.0.0.1/8"), ("--dashboard-cidr", "10.0.0.0"), ("--dashboard-cidr", "x/99")])
def test_bad_values_of_the_new_flags_are_one_line_exit_2(runner, flag, value):
    result = runner.invoke(main, ["render", "--name", "x", flag, value])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert flag in result.output and "Traceback" not in result.output
