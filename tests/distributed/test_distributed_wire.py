"""Distributed runs without a Redis: the wire format, the rendezvous file, the config rules, the job plan."""

from __future__ import annotations

import pickle
import re
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml
from factories import deep_update

from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.distributed import rendezvous, wire
from hpcrl.schedulers import get_scheduler
from hpcrl.submit.pipeline import plan_scripts

DISTRIBUTED = Path(__file__).resolve().parents[2] / "hpcrl" / "distributed"
APEX = {
    "name": "apex", "algo": "dqn", "env": {"id": "CartPole-v1"}, "train": {"total_steps": 1000, "learning_starts": 100, "hidden_sizes": [16]},
    "distributed": {"actors": 2}, "sweep": {"seeds": [0, 1, 2]}, "resources": {"max_concurrent": 3},
}


def write_config(directory: Path, changes: dict) -> Path:
    path = directory / "apex.yaml"
    path.write_text(yaml.safe_dump(deep_update({**APEX, "output": str(directory / "logs")}, changes)))
    return path


def batch(n: int = 5) -> dict[str, np.ndarray]:
    return {
        "obs": np.arange(n * 4, dtype=np.float32).reshape(n, 4),
        "action": np.arange(n, dtype=np.int64) % 2,
        "reward": np.ones(n, np.float32),
        "done": np.zeros(n, bool),
    }


def test_round_trip_keeps_values_versions_and_views_without_copy() -> None:
    data = wire.encode(wire.BATCH, version=7, sender=3, seq=41, fields=batch())
    message = wire.decode(data)
    assert (message.kind, message.version, message.sender, message.seq) == (wire.BATCH, 7, 3, 41)
    for name, value in batch().items():
        np.testing.assert_array_equal(message.fields[name], value)
        assert message.fields[name].dtype == value.dtype
    assert not message.fields["obs"].flags.writeable  # a view of the received bytes, not a copy


def test_big_endian_and_non_contiguous_inputs_are_normalised() -> None:
    obs = np.arange(20, dtype=">f4").reshape(4, 5)[:, ::2]
    message = wire.decode(wire.encode(wire.BATCH, 0, 0, 0, {"obs": obs}))
    np.testing.assert_array_equal(message.fields["obs"], obs)


@pytest.mark.parametrize(
    "data, reason",
    [
        (pickle.dumps({"obs": np.zeros(3)}), "bad magic"),
        (b"HPRL", "shorter than"),
        (wire.encode(wire.BATCH, 0, 0, 0, batch())[:-1], "body is"),
        (wire.encode(wire.BATCH, 0, 0, 0, batch()) + b"\0", "body is"),
        (wire.HEADER.pack(wire.MAGIC, 9, wire.BATCH, 0, 0, 0, 0, 0), "format version"),
        (wire.HEADER.pack(wire.MAGIC, 1, 7, 0, 0, 0, 0, 0), "unknown message kind"),
        (wire.HEADER.pack(wire.MAGIC, 1, wire.BATCH, 1, 0, 0, 0, 8) + b"\x01O8\x00xxxx", "dtype code"),
        # one field claiming 2**32-1 x 2**32-1 floats: refused from the table, before any allocation
        (wire.HEADER.pack(wire.MAGIC, 1, wire.BATCH, 1, 0, 0, 0, 13) + b"\x01f4\x02x" + b"\xff" * 8, "claims"),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(wire.MalformedMessage, match=reason):
        wire.decode(data)


def test_object_arrays_cannot_be_sent() -> None:
    with pytest.raises(TypeError, match="cannot be sent"):
        wire.encode(wire.BATCH, 0, 0, 0, {"x": np.array([{"a": 1}], dtype=object)})


def test_schema_check_names_the_bad_field() -> None:
    message = wire.decode(wire.encode(wire.BATCH, 0, 0, 0, batch()))
    schema = {"obs": (np.dtype(np.float32), (4,)), "action": (np.dtype(np.int64), ()), "reward": (np.dtype(np.float32), ()), "done": (np.dtype(bool), ())}
    wire.check_fields(message.fields, schema, leading=True)
    with pytest.raises(wire.MalformedMessage, match="'obs'"):
        wire.check_fields(message.fields, {**schema, "obs": (np.dtype(np.float32), (8,))}, leading=True)


def test_nothing_in_the_distributed_package_pickles() -> None:
    """No pickle (nor numpy's allow_pickle, nor torch.load of network data) anywhere in hpcrl/distributed."""
    offenders = []
    for path in sorted(DISTRIBUTED.glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bimport pickle\b|\bpickle\.|allow_pickle|torch\.load|\bmarshal\b|\bdill\b", code):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []


def test_rendezvous_is_private_and_replaced_atomically(tmp_path: Path) -> None:
    first = rendezvous.Rendezvous("10.0.0.5", 6400, "secret", "hpcrl:r:", "aaaa", "node1", 11)
    rendezvous.write(tmp_path, first)
    assert stat.S_IMODE(rendezvous.path(tmp_path).stat().st_mode) == 0o600
    assert rendezvous.read(tmp_path) == first
    second = rendezvous.Rendezvous("10.0.0.6", 6401, "other", "hpcrl:r:", "bbbb", "node2", 12)
    rendezvous.write(tmp_path, second)
    assert rendezvous.read(tmp_path) == second and list(tmp_path.iterdir()) == [rendezvous.path(tmp_path)]
    rendezvous.remove(tmp_path, "aaaa")  # not the current learner's: kept
    assert rendezvous.read(tmp_path) == second
    # An actor waiting for a *new* learner start ignores the current one and times out.
    assert rendezvous.wait(tmp_path, 0.3, not_instance="bbbb") is None
    rendezvous.remove(tmp_path, "bbbb")
    assert not rendezvous.path(tmp_path).exists()


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_on_policy_algorithms_are_refused(tmp_path: Path, algo: str) -> None:
    with pytest.raises(ConfigError, match="V-trace"):
        load_experiment(write_config(tmp_path, {"algo": algo}))


def test_bundled_apex_config_loads() -> None:
    exp = load_experiment(Path(__file__).resolve().parents[2] / "configs" / "cartpole_apex.yaml")
    assert exp.algo == "dqn" and exp.distributed is not None and exp.distributed.actors == 2
    assert exp.train.n_step == 5  # DQN's train.n_step, which the actors use


def test_n_step_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train.n_step: expected a positive integer"):
        load_experiment(write_config(tmp_path, {"train": {"n_step": 0}}))


@pytest.mark.parametrize("scheduler", ["slurm", "sge"])
def test_cluster_plan_is_a_gpu_learner_array_and_a_cpu_actor_array(tmp_path: Path, scheduler: str) -> None:
    exp = load_experiment(write_config(tmp_path, {}), ["resources.gpus=1"])
    planned = plan_scripts(exp, get_scheduler(scheduler, exp.dir), [0, 1, 2], 0)
    assert [p.stage for p in planned] == ["learner", "actors", "eval", "aggregate"]
    learner, actors = planned[0], planned[1]
    assert learner.runs == [0, 1, 2] and actors.runs == [0, 0, 1, 1, 2, 2]
    gpu = "--gres=gpu:1" if scheduler == "slurm" else "-l gpu=1"
    assert gpu in learner.text and gpu not in actors.text
    assert " learner " in learner.text and " actor " in actors.text
    assert planned[2].after == [(learner.script, "each")]


def test_local_plan_runs_one_gang_at_a_time_and_refuses_a_pool_too_small(tmp_path: Path) -> None:
    exp = load_experiment(write_config(tmp_path, {}))
    planned = plan_scripts(exp, get_scheduler("local", exp.dir), [0, 1, 2], 0)
    learners = [p for p in planned if p.stage == "learner"]
    assert [p.runs for p in learners] == [[0], [1], [2]]
    assert learners[1].after == [(learners[0].script, "all")]
    small = load_experiment(write_config(tmp_path, {"resources": {"max_concurrent": 2}}))
    with pytest.raises(ConfigError, match="max_concurrent to at least 3"):
        plan_scripts(small, get_scheduler("local", small.dir), [0], 0)


def test_actor_task_maps_to_run_and_actor(tmp_path: Path) -> None:
    from hpcrl.store.rundir import actor_of_task

    (tmp_path / "a.tasks").write_text("4\n4\n7\n7\n")
    assert [actor_of_task(tmp_path, "a.tasks", t) for t in (1, 2, 3, 4)] == [(4, 0), (4, 1), (7, 0), (7, 1)]
