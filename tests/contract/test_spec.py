"""JobSpec: validation, job-file handling, and 'defaults live once'."""

from __future__ import annotations

import dataclasses

import pytest

from submitter.contract.errors import SpecError
from submitter.contract.spec import LOCAL_DEFAULTS, JobSpec, defaults, flag_name


def test_defaults_build_a_valid_spec_with_just_a_name():
    spec = JobSpec.build(name="gpt2-demo")
    assert spec.replicas == defaults()["replicas"]
    assert spec.resolved_storage_path == spec.storage_mount


def test_local_defaults_are_valid_fields():
    JobSpec.build(LOCAL_DEFAULTS)


def test_flags_override_job_file_and_kebab_keys_work():
    spec = JobSpec.build({"name": "a", "gpu-per-pod": 2, "replicas": 3}, replicas=5, name=None)
    assert (spec.name, spec.gpu_per_pod, spec.replicas) == ("a", 2, "5")


@pytest.mark.parametrize("values, message", [
    ({"name": ""}, "name is required"),
    ({"name": "Gpt2"}, "not a valid name"),
    ({"name": "1job"}, "not a valid name"),
    ({"name": "a" * 48}, "at most 47"),
    ({"name": "job-"}, "not a valid name"),
    ({"name": "j", "namespace": "Team_A"}, "namespace"),
    ({"name": "j", "replicas": 0}, "neither a number of worker pods"),
    ({"name": "j", "replicas": "eight"}, "nor a MIN:MAX range"),
    ({"name": "j", "replicas": 2.5}, "nor a MIN:MAX range"),
    ({"name": "j", "replicas": True}, "must be text"),
    ({"name": "j", "replicas": "3:1"}, "MIN must not be larger than MAX, e.g. 1:3"),
    ({"name": "j", "replicas": "1:20000"}, "at most 10000"),
    ({"name": "j", "replicas": "1 : 2"}, "nor a MIN:MAX range"),
    ({"name": "j", "replicas": "0:2"}, "nor a MIN:MAX range"),
    ({"name": "j", "gpu_per_pod": -1}, "at least 0"),
    ({"name": "j", "memory_per_pod": "16 GB"}, "quantity"),
    ({"name": "j", "cpu_per_pod": "four"}, "quantity"),
    ({"name": "j", "model": "gpt5"}, "not one of"),
    ({"name": "j", "image_pull_policy": "Sometimes"}, "not one of"),
    ({"name": "j", "storage_access_mode": "RWX"}, "not one of"),
    ({"name": "j", "existing_pvc": "My PVC"}, "PVC name"),
    ({"name": "j", "storage_class": "Fast_SSD"}, "storage class"),
    ({"name": "j", "learning_rate": 0}, "positive"),
    ({"name": "j", "learning_rate": "nan"}, "must be a number"),
    ({"name": "j", "learning_rate": float("inf")}, "finite"),
    ({"name": "j", "env": {"1X": "v"}}, "environment variable name"),
    ({"name": "j", "env": ["A=1"]}, "mapping"),
    ({"name": "j", "fsdp": "yes"}, "true or false"),
    ({"name": "j", "dataset": "--fsdp"}, "may not look like a flag"),
    ({"name": "j", "data": "/mnt/a\nb"}, "control characters"),
    ({"name": "j", "epochs": None}, "must have a value"),
    ({"name": None}, "must have a value"),
    ({"name": "j", "cpu_per_pod": "\u0664"}, "quantity"),
    ({"name": "j", "replicas": "\u0664"}, "nor a MIN:MAX range"),
    ({"name": "j", "max_steps_per_epoch": 2**31}, "at most 2147483647"),
    ({"name": "j", "seed": 2**40}, "at most"),
    ({"name": "j", "storage_size": "0"}, "more than zero"),
    ({"name": "j", "memory_per_pod": "0Gi"}, "more than zero"),
    ({"name": "j", "dataset": "x" * 5000}, "too long"),
    ({"name": "j", "val_percent": 100}, "[0, 100)"),
    ({"name": "j", "replica": 3}, "did you mean 'replicas'"),
    ({"name": "abc\n"}, "not a valid name"),
    ({"name": "j", "cpu_per_pod": "4\n"}, "quantity"),
    ({"name": "j", "dataset": ""}, "empty"),
    ({"name": "j", "bpe_file": ""}, "empty"),
    ({"name": "j", "image": "Not An Image"}, "image"),
])
def test_invalid_values_are_refused_with_the_flag_named(values, message):
    with pytest.raises(SpecError) as info:
        JobSpec.build(values)
    assert message in str(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    assert info.value.exit_code == 2


def test_values_that_used_to_need_shell_quoting_are_plain_data_now():
    """The job reaches the pod as JSON, never through a shell: any text is safe to carry."""
    spec = JobSpec.build(name="j", dataset="org/name with space",
                         storage_path="/mnt/checkpoints/$(id);x", env={"A": "'$(rm -rf /)'"})
    assert JobSpec.from_document(spec.document()) == spec


def test_types_come_from_the_real_annotations():
    from submitter.contract.spec import field_types, optional_fields

    types = field_types()
    assert types["replicas"] is str and types["epochs"] is int and types["learning_rate"] is float
    assert types["max_steps_per_epoch"] is int and "max_steps_per_epoch" in optional_fields()
    assert types["env"] is dict and types["fsdp"] is bool
    assert JobSpec.build(name="j", max_steps_per_epoch="12").max_steps_per_epoch == 12
    assert JobSpec.build(name="j", max_steps_per_epoch=None).max_steps_per_epoch is None


def test_a_missing_optional_setting_in_a_document_is_null():
    """Helm drops keys set to null; the pod reads the missing key as that null."""
    doc = JobSpec.build(name="j", dataset_config=None).to_values()
    del doc["datasetConfig"]
    import json

    assert JobSpec.from_document(json.dumps(doc)).dataset_config is None
    assert JobSpec.build(doc).dataset_config == defaults()["dataset_config"]  # a job file: default


def test_quantities_from_yaml_numbers_are_accepted():
    spec = JobSpec.build({"name": "j", "cpu_per_pod": 8, "head_cpu": 0.5})
    assert (spec.cpu_per_pod, spec.head_cpu) == ("8", "0.5")


def test_worker_count_is_replicas_times_gpus_or_replicas():
    assert JobSpec.build(name="j", replicas=8, gpu_per_pod=1).num_train_workers == 8
    assert JobSpec.build(name="j", replicas=2, gpu_per_pod=4, cpu_per_pod="8").num_train_workers == 8
    assert JobSpec.build(name="j", replicas=3).num_train_workers == 3


def test_run_name_derives_from_the_job_name_not_random():
    assert JobSpec.build(name="gpt2-demo").run_name == "gpt2-demo"


def test_every_field_has_help_and_a_flag():
    for f in dataclasses.fields(JobSpec):
        assert f.metadata["help"], f.name
        assert flag_name(f.name).startswith("--")


def test_spec_is_immutable():
    spec = JobSpec.build(name="j")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.replicas = 3  # type: ignore[misc]


@pytest.mark.parametrize("values", [{"fsdp": True}, {"fsdp": True, "gpu_per_pod": 0}])
def test_fsdp_without_gpus_is_refused_with_the_fix(values):
    with pytest.raises(SpecError, match=r"--fsdp shards the model across GPUs: add --gpu-per-pod"):
        JobSpec.build({"name": "j", **values})
    assert JobSpec.build({"name": "j", "fsdp": True, "gpu_per_pod": 1}).fsdp


# --- #10 item 2: resources that fit -----------------------------------------------------------

@pytest.mark.parametrize("cpu, gpus, per_worker", [
    ("4", 0, 3), ("2", 0, 1), ("4", 1, 3), ("16", 8, 1), ("64", 8, 7), ("16", 4, 3),
    ("4500m", 2, 1), ("1500m", 0, 1), ("4", 2, 1)])
def test_cpus_per_train_worker_leave_ray_data_a_cpu_per_gpu(cpu, gpus, per_worker):
    spec = JobSpec.build(name="j", cpu_per_pod=cpu, gpu_per_pod=gpus, memory_per_pod="64Gi")
    assert spec.cpus_per_train_worker == per_worker
    assert spec.data_cpus_per_pod == max(1, gpus)  # DATA_CPUS_PER_GPU, at least one
    assert spec.cpus_per_train_worker * spec.workers_per_pod + spec.data_cpus_per_pod <= \
        -(-float(cpu.rstrip("m")) // (1000 if cpu.endswith("m") else 1))


@pytest.mark.parametrize("cpu, gpus, fix", [("1", 0, "2"), ("500m", 0, "2"), ("4", 4, "8"),
                                             ("8", 8, "16"), ("2", 2, "4")])
def test_pods_that_cannot_hold_their_workers_are_refused_in_one_line(cpu, gpus, fix):
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="j", cpu_per_pod=cpu, gpu_per_pod=gpus)
    message = str(info.value)
    assert "\n" not in message and f"--cpu-per-pod {fix} or more" in message
    assert info.value.exit_code == 2


def test_the_pod_derives_the_same_cpus_per_worker_from_its_document():
    spec = JobSpec.build(name="j", cpu_per_pod="16", gpu_per_pod=4)
    assert JobSpec.from_document(spec.document()).cpus_per_train_worker == 3


# --- --replicas MIN:MAX and --global-batch-size ----------------------------------------------------

@pytest.mark.parametrize("replicas, gpus, expected", [
    (3, 0, (3, 3, False, 3, 3)), ("3", 0, (3, 3, False, 3, 3)), ("3:3", 0, (3, 3, False, 3, 3)),
    ("1:4", 0, (1, 4, True, 1, 4)), ("2:3", 8, (2, 3, True, 16, 24))])
def test_replicas_is_a_count_or_a_range(replicas, gpus, expected):
    spec = JobSpec.build(name="j", replicas=replicas, gpu_per_pod=gpus, cpu_per_pod="16",
                         memory_per_pod="64Gi")
    assert (spec.min_replicas, spec.max_replicas, spec.elastic, spec.min_train_workers,
            spec.num_train_workers) == expected


def test_the_cpu_fit_check_holds_for_an_elastic_group():
    with pytest.raises(SpecError, match="--cpu-per-pod 4 gives Ray 4 CPU.*use --cpu-per-pod 16"):
        JobSpec.build(name="j", replicas="1:4", gpu_per_pod=8)


@pytest.mark.parametrize("replicas, per_worker, global_batch", [
    ("2", 8, 16), ("2", 8, 48), ("1:2", 8, 16), ("2:4", 8, 96), ("2:4", 4, 48), ("1:3", 1, 6)])
def test_a_global_batch_every_group_size_reaches_is_accepted(replicas, per_worker, global_batch):
    from submitter.contract.batch import shares

    spec = JobSpec.build(name="j", replicas=replicas, batch_size_per_worker=per_worker,
                         global_batch_size=global_batch)
    for world in range(spec.min_train_workers, spec.num_train_workers + 1):
        split = shares(global_batch, world, per_worker)
        assert sum(split) == global_batch and len(split) == world  # the same step on every size
        assert all(share > 0 and share % per_worker == 0 for share in split)  # whole micro-batches


@pytest.mark.parametrize("replicas, global_batch, message", [
    ("2", 24, "--global-batch-size 24 is not a multiple of 2 worker(s) x --batch-size-per-worker "
              "8 = 16: use 16 or 32"),  # a fixed group: the nearest multiples
    # an elastic group may split it unequally (a token-mean loss), in whole micro-batches
    ("1:3", 20, "--global-batch-size 20 is not a multiple of --batch-size-per-worker 8: use 24"),
    ("2:4", 24, "--global-batch-size 24 leaves some of 4 workers without a micro-batch: use 32"),
])
def test_a_global_batch_some_group_size_cannot_reach_is_refused_in_one_line(
        replicas, global_batch, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        JobSpec.build(name="j", replicas=replicas, global_batch_size=global_batch)
    assert "\n" not in str(e.value)


# --- #10 item 2: memory that fits -------------------------------------------------------------

@pytest.mark.parametrize("model, gpus, memory, fix", [
    ("gpt2-small", 8, "16Gi", "26Gi"), ("gpt2-small", 1, "2Gi", "6Gi"), ("tiny", 0, "1Gi", "2Gi"),
    ("tiny", 4, "2Gi", "4Gi")])
def test_pods_without_memory_for_their_workers_are_refused_in_one_line(model, gpus, memory, fix):
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="j", model=model, gpu_per_pod=gpus, cpu_per_pod=str(2 * gpus + 2),
                      memory_per_pod=memory)
    message = str(info.value)
    assert "\n" not in message and f"--memory-per-pod {fix} or more" in message
    assert info.value.exit_code == 2
    fixed = JobSpec.build(name="j", model=model, gpu_per_pod=gpus, cpu_per_pod=str(2 * gpus + 2),
                          memory_per_pod=fix)  # the suggested size is accepted
    assert fixed.memory_per_pod == fix


def test_the_memory_floor_counts_the_host_copy_an_async_checkpoint_upload_holds():
    """Issue 23 item 3: a save hands a host copy of the whole state (~1.5 GB for gpt2-small with
    AdamW) to the upload thread while training goes on; the floor holds it."""
    from submitter.contract.spec import host_state_gib, memory_problem

    assert 1.35 < host_state_gib("gpt2-small") < 1.45 and host_state_gib("tiny") < 0.1
    assert memory_problem("gpt2-small", 1, "4Gi", "8Gi") is not None  # main accepted 4Gi
    assert "1.38 GiB host copy" in memory_problem("gpt2-small", 1, "4Gi", "8Gi")
    assert memory_problem("gpt2-small", 1, "6Gi", "8Gi") is None


def test_a_head_below_what_its_processes_take_is_refused():
    with pytest.raises(SpecError, match="--head-memory 1Gi is below .*use --head-memory 3Gi"):
        JobSpec.build(name="j", head_memory="1Gi")
    assert JobSpec.build(name="j", head_memory="2Gi").head_memory == "2Gi"


def test_the_default_pod_fits_the_readme_headline_job():
    spec = JobSpec.build(name="gpt2-demo", replicas=8, gpu_per_pod=1)
    assert spec.memory_per_pod == "16Gi" and spec.num_train_workers == 8


def test_field_types_read_without_eval_match_typing():
    """field_types()/optional_fields() read the annotation text (render's start-up); they must
    say what typing.get_type_hints says, for every field, so a new setting cannot drift."""
    from submitter.contract import spec as S

    assert S._annotations() == S._annotations_evaluated()
    assert S.field_types()["replicas"] is str and S.field_types()["env"] is dict
    assert "block_size" in S.optional_fields() and "epochs" not in S.optional_fields()


def test_jobspec_equality_hash_and_repr_as_a_dataclass_writes_them():
    import dataclasses

    a, b = JobSpec.build({"name": "x"}), JobSpec.build({"name": "x"})
    c = dataclasses.replace(a, epochs=a.epochs + 1)
    assert a == b and a != c and a.__eq__(object()) is NotImplemented
    assert repr(a).startswith("JobSpec(name='x', namespace='default', ") and repr(a).endswith(")")
    assert repr(a).count("=") >= len(dataclasses.fields(JobSpec))
    with pytest.raises(TypeError):  # dict and list fields: unhashable, as a generated __hash__ is
        hash(a)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.epochs = 3


def test_every_default_passes_its_own_check():
    """JobSpec skips the per-field check of a value equal to the field's default (render's
    start-up compiles fewer patterns): so every default must pass that check."""
    import dataclasses

    from submitter.contract import spec as S

    for f in dataclasses.fields(JobSpec):
        if f.default not in (dataclasses.MISSING, None, ""):  # "": required (--name)
            S._check_value(f, f.default)  # raises SpecError if a default is refused
    # and a non-default value of the same field is still checked
    with pytest.raises(S.SpecError, match="--gpu-toleration"):
        JobSpec.build({"name": "x", "gpu_toleration": "bad toleration"})
