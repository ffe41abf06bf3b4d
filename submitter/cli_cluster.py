"""Cluster commands: watch, status, list, logs, delete, resume (filled in by the cluster-side work)."""

COMMANDS: list = []
