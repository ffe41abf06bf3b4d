"""The contract between the two deployables: the CLI (`submitter`) and the pod (`training`).

Stdlib only, and it imports neither side: JobSpec and its validation (`spec`), the storage
policy (`storage`), the one error hierarchy (`errors`), the status-event schema and its fold
(`events`), and every name both sides must agree on (`naming`). import-linter holds these
walls in the test suite (see `.importlinter`).
"""
