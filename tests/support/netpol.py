"""What a NetworkPolicy admits, as the Kubernetes NetworkPolicy API defines it (pure; enough
for the policies we render: ingress rules, pod/namespace selectors with matchLabels and
matchExpressions, ipBlock with except, ports by number).

A peer is a pod (its namespace's labels, its own labels) or, for traffic from outside the pod
network (the API server, a node), only an IP address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class Peer:
    namespace: str = "default"
    namespace_labels: dict[str, str] = field(default_factory=dict)
    pod_labels: Optional[dict[str, str]] = None  # None: not a pod (an IP outside the pod network)
    ip: Optional[str] = None


def selects(selector: Optional[dict], labels: dict[str, str]) -> bool:
    """A LabelSelector: {} selects everything; matchLabels and matchExpressions are ANDed."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def peer_matches(rule_peer: dict, peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in rule_peer:
        if peer.ip is None:
            return False  # pod-to-pod traffic is matched by selectors, not by pod IPs here
        block = rule_peer["ipBlock"]
        address = ipaddress.ip_address(peer.ip)
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(e) for e in block.get("except") or [])
    if peer.pod_labels is None:
        return False  # selectors only ever match pods
    ns_selector, pod_selector = rule_peer.get("namespaceSelector"), rule_peer.get("podSelector")
    if ns_selector is None:  # podSelector alone: pods of the policy's own namespace
        in_namespace = peer.namespace == policy_namespace
    else:
        in_namespace = selects(ns_selector, peer.namespace_labels)
    return in_namespace and selects(pod_selector if pod_selector is not None else {}, peer.pod_labels)


def port_matches(ports: Optional[list[dict]], port: int, protocol: str = "TCP") -> bool:
    if not ports:
        return True  # no ports: every port
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        start, end = p["port"], p.get("endPort", p["port"])
        if isinstance(start, int) and start <= port <= end:
            return True
    return False


def admits(policy: dict, peer: Peer, port: int, *, target_labels: dict[str, str] | None = None,
           protocol: str = "TCP") -> bool:
    """Is ingress from `peer` to `port` of a pod (labels `target_labels`, default: the policy's
    own podSelector's matchLabels) admitted by this one policy? A pod the policy does not select,
    or a policy without Ingress in its types, admits everything."""
    spec = policy.get("spec") or {}
    namespace = (policy.get("metadata") or {}).get("namespace", "default")
    target = target_labels if target_labels is not None else \
        dict((spec.get("podSelector") or {}).get("matchLabels") or {})
    if not selects(spec.get("podSelector") or {}, target):
        return True
    if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
        return True
    for rule in spec.get("ingress") or []:
        peers = rule.get("from")
        if peers and not any(peer_matches(p, peer, namespace) for p in peers):
            continue
        if port_matches(rule.get("ports"), port, protocol):
            return True
    return False


def admitted_ports(policy: dict, peer: Peer, ports: tuple[int, ...] = (6379, 8080, 8265, 10001)) -> set[int]:
    return {p for p in ports if admits(policy, peer, p)}

