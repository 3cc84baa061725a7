"""The `distributed:` section: decoupled learner and actor jobs (Ape-X, AlphaZero self-play) over Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hpcrl.config.limits import MAX_ENVS
from hpcrl.config.resources_spec import mem_problem
from hpcrl.config.schema import env_name_problem, non_empty_problem, setting


def _address_problem(text: str) -> str | None:
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536:
        return None
    return f"expected host:port, got {text!r}"


def _bind_problem(text: str) -> str | None:
    if text.strip() and not any(c.isspace() for c in text):
        return None
    return f"expected an address or 'auto', got {text!r}"


@dataclass
class RedisConfig:
    """Where the run's board and queue live."""

    address: Optional[str] = setting(None, valid=_address_problem)
    """`host:port` of an external Redis shared by the runs; empty: each learner job starts its own
    redis-server (the Debian package; `hpcrl build-image` installs it with image.extras: [distributed])."""
    password_env: str = setting("HPCRL_REDIS_PASSWORD", valid=env_name_problem)
    """Environment variable of the learner job that holds the external Redis's password (never the config file)."""
    bind: str = setting("auto", valid=_bind_problem)
    """Address the learner's own redis-server listens on; `auto`: the address the learner node's host name
    resolves to (what actors on other nodes dial); `127.0.0.1` keeps it to one machine."""
    executable: str = setting("redis-server", valid=non_empty_problem)
    """The redis-server a learner job starts (a name on the job's PATH, or a path)."""


@dataclass
class DistributedConfig:
    """Ape-X style: per run, one learner job and an array of actor jobs talking through Redis.

    Only off-policy learning is correct when actors act with parameters a few versions old, so
    this section requires `algo: dqn` (the learner keeps DQN's replay; train.* still applies) or
    `algo: alphazero` (a trainer job and `actors` self-play jobs; hpcrl/distributed/selfplay.py).
    """

    actors: int = setting(2, ge=1, le=10_000)
    """Actor jobs per run (AlphaZero: self-play jobs)."""
    envs_per_actor: int = setting(4, ge=1, le=MAX_ENVS)
    """Envs per actor; for AlphaZero, the games a self-play job plays in lockstep (one forward pass for all their leaves)."""
    batch_transitions: int = setting(64, ge=1, le=1_000_000)
    """Transitions per message an actor sends (rounded up to whole vector steps; AlphaZero: positions, rounded up to whole games)."""
    batches_per_send: int = setting(8, ge=1, le=1024, learned=False)
    """Batches an actor coalesces into one round trip at most (each stays its own message on the queue)."""
    send_delay_s: float = setting(0.002, ge=0, le=60, learned=False)
    """Longest a built batch waits for others before it is sent (0: each batch goes at once). Short on
    purpose: an actor sends its waiting batches and reads the parameter version once per round trip, so
    a batch held back longer was acted on with older parameters (20 ms: 205 stale drops in a CartPole
    run of the bundled config, against 16 with one batch per round trip)."""
    queue_bound: int = setting(8, ge=1, le=100_000)
    """Batches the queue may hold; a full queue blocks the actors (backpressure) instead of dropping.
    Small on purpose: a batch waits in a full queue for queue_bound x batch_transitions x updates per
    transition / publish_every parameter versions, which must stay below max_lag."""
    publish_every: int = setting(20, ge=1)
    """Learner updates between parameter publications; each publication is a new parameter version."""
    max_lag: int = setting(25, ge=0)
    """Batches produced with parameters more than this many versions old are dropped (and counted)."""
    ratio_slack: float = setting(0.0, ge=0, le=1)
    """How far the learner's updates per unit of data (DQN: per transition; AlphaZero: per game) may
    drift from the set ratio, as a fraction of the updates earned so far, so that neither side waits:
    with no batch queued the learner trains ahead on its window, with the queue half full it takes
    batches and owes the updates (hpcrl/distributed/pace.py). 0: the ratio is held exactly, and the
    faster side waits for the slower one; `hpcrl status` shows the realised ratio."""
    epsilon: float = setting(0.4, gt=0, le=1)
    """Ape-X's base ε: each env slot explores with a power of it (epsilon_alpha)."""
    epsilon_alpha: float = setting(7.0, ge=0)
    """Env slot k of K acts with epsilon ** (1 + alpha * k / (K - 1)) (Ape-X's per-actor exploration)."""
    prioritized: bool = False
    """Prioritised replay on the learner (proportional, with importance weights)."""
    priority_alpha: float = setting(0.6, ge=0)
    """Prioritised replay's exponent: how much the TD error shapes sampling (0: uniform)."""
    priority_beta: float = setting(0.4, ge=0, le=1)
    """Initial importance-sampling exponent, annealed to 1 over total_steps."""
    heartbeat_s: float = setting(1.0, gt=0, learned=False)
    """Seconds between an actor's heartbeats (and the learner's reports to `hpcrl status`)."""
    dead_after_s: float = setting(3.0, gt=0, learned=False)
    """An actor whose heartbeat is older than this is reported dead (its key expires)."""
    learner_timeout_s: float = setting(600.0, gt=0, learned=False)
    """Actors wait this long for a learner (at start, or after it went away) before exiting with code 75."""
    parallel_runs: Optional[int] = setting(None, ge=1, learned=False)
    """Runs whose learner and actors run at once; later runs wait for the earlier learners. Default: all on
    a cluster; on the local executor, as many as its task pool (resources.max_concurrent) holds."""
    actor_cpus: int = setting(1, ge=1, learned=False)
    """CPUs of each actor job."""
    actor_mem: str = setting("2G", valid=mem_problem, learned=False)
    """Memory of each actor job, with a unit (`2G`)."""
    redis: RedisConfig = setting(factory=RedisConfig, learned=False)

    def check(self) -> list[tuple[str, str]]:
        if self.dead_after_s <= self.heartbeat_s:
            return [("dead_after_s", f"must be longer than heartbeat_s ({self.heartbeat_s:g})")]
        return []
