"""Proximal Policy Optimisation (Schulman et al. 2017), after CleanRL's ppo.py, and the rollout
that A2C shares.

`OnPolicyAgent` owns everything both algorithms do the same way: collect `num_steps` vector steps
from all envs with one batched forward pass per step, bootstrap truncated episodes (CartPole's
500-step limit is not a failure), carry a GRU state across steps and zero it where episodes
start, compute GAE, anneal the learning rate, update observation statistics, and save/restore all
of it. `PPO` adds the clipped-surrogate update: `update_epochs` passes over minibatches with
advantage normalisation per minibatch, a clipped value loss, an entropy bonus and global gradient
clipping. a2c.py adds A2C's single-step update to the same rollout: the subtle parts (autoreset,
truncation, recurrent resets, resume) then exist once, and each algorithm file holds only what
makes it that algorithm.

Storage stays where it is used: observations, actions, log-probs and values on the device (the
update reads them there), rewards and episode starts in host memory, where GAE runs in numpy
(T small vectors: cheaper than T x 6 tiny device ops, and no per-step host-device transfer).
"""

from __future__ import annotations

import contextlib
import copy
import math
import subprocess
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from hpcrl.config.hparams import OnPolicyConfig, PPOConfig
from hpcrl.cores import usable_cores
from hpcrl.rl import graphs
from hpcrl.rl.ddp import Ranks
from hpcrl.rl.envs import GroupedVectorEnv, final_observations, finished_episodes
from hpcrl.rl.learner_process import LearnerProcess
from hpcrl.rl.networks import ActorCritic, Obs, cast_for_acting, is_image, obs_to_tensor
from hpcrl.rl.optim import Adam, FlatOptimizer, GradientStep
from hpcrl.rl.rollout import FasterOfTwo, Rollout, RolloutThread, Uploader, YieldingUpdate, run_to_end


def _map(fn: Callable[[torch.Tensor], torch.Tensor], obs: Obs) -> Obs:
    """Apply `fn` to an observation batch, key by key for Dict observations."""
    return {k: fn(v) for k, v in obs.items()} if isinstance(obs, dict) else fn(obs)


ALL = slice(None)
"""Every env of the vector env: the rollout of an env that is not in worker groups."""

LEARNER_PROCESS_ITERATIONS = 500
"""The iterations from which a run of vector (not image) observations gives its update to a learner process. Its
start (importing torch at background priority: some 3 s before it is ready) is then a small part of the run; async
PPO on CartPole (4 envs in workers, 2 cores, about 30 ms an iteration) made 4,181 steps/s with its update in a
learner process against 3,636-3,686 at normal priority and 3,089-3,149 in the background thread. A CNN's update
always pays for it."""


def _write(storage: Obs, step: int | tuple[int, slice] | slice, obs: Obs) -> None:
    if isinstance(storage, dict):
        for k in storage:
            storage[k][step] = obs[k]
    else:
        storage[step] = obs


def gae(rewards: np.ndarray, values: np.ndarray, firsts: np.ndarray, next_value: np.ndarray, next_first: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates (Schulman et al. 2016) for (T, N) arrays.

    `firsts[t]` marks observations that start an episode, so the recursion is cut between
    t and t+1 where `firsts[t+1]` is set. Truncated episodes have their bootstrap value already
    folded into the last reward, so a cut there is right too.
    """
    steps = rewards.shape[0]
    adv = np.zeros_like(rewards)
    last = np.zeros_like(next_value)
    for t in reversed(range(steps)):
        if t == steps - 1:
            nonterminal, next_values = 1.0 - next_first, next_value
        else:
            nonterminal, next_values = 1.0 - firsts[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_values * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv


class OnPolicyAgent:
    """Rollout, GAE and checkpointing for actor-critic algorithms; subclasses define the update
    (`update_steps`, a generator of its gradient steps).

    With `train.async_rollout` (the default for envs in worker processes), the envs collect
    rollout k+1 with the policy of iteration k (a copy, the behaviour policy) in a background
    thread while the update of rollout k runs (hpcrl/rl/rollout.py). On a CPU that update may run
    at background priority (`YieldingUpdate`) until the rollout is done, leaving the cores to the
    rollout (unless the update outlasts it and normal priority was measured faster in this run:
    `FasterOfTwo`), in a learner process of its own where that pays (`hpcrl.rl.learner_process`);
    it learns the same numbers either way.
    Otherwise a rollout and its update take turns, and the update learns from the policy that
    acted (exact on-policy PPO).
    """

    metric_names: tuple[str, ...] = ()
    resumable_update = False
    """Whether `update_steps(batch, start, clipped)` can take up an update another process began
    (`hpcrl.rl.learner_process`): PPO's many gradient steps; A2C's one step gains nothing there."""

    def __init__(self, cfg: OnPolicyConfig, envs: gym.vector.VectorEnv, device: torch.device, seed: int, ranks: Ranks | None = None) -> None:
        self.cfg, self.envs, self.device = cfg, envs, device
        self.ranks = ranks or Ranks.single()
        """DD-PPO: every rank collects its own rollout; gradients, advantage statistics and
        observation moments are averaged over the ranks, so they all hold the same policy."""
        self.policy = self.make_policy(cfg, envs.single_observation_space, envs.single_action_space).to(device)
        self.gradient_step = GradientStep(self.policy.parameters(), self.make_optimizer, cfg.max_grad_norm, cfg.amp, device, self.ranks.average_ if self.ranks.distributed else None)
        self.sync_policy()
        self.num_envs = n = envs.num_envs
        self.batch_size = n * cfg.num_steps
        """This rank's rollout; an update of all ranks sees `world` times as many transitions."""
        self.steps_per_iteration = self.batch_size * self.ranks.world
        self.num_iterations = math.ceil(cfg.total_steps / self.steps_per_iteration)
        self.planned_steps = self.num_iterations * self.steps_per_iteration
        """total_steps rounded UP to whole rollouts (as SB3 does): every update sees a full batch, so
        minibatch sizes, the GAE horizon and the GRU's sequences are the same in every iteration."""
        self.losses_finite = torch.ones((), dtype=torch.bool, device=device)
        """Whether every loss so far was finite: kept on the device, read once per iteration."""
        self.global_step = 0
        """Environment steps of the rollouts updated from (a rollout in flight is not counted)."""
        self.iteration = 0
        self.episodes: list[tuple[float, int]] = []
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        self.rollout = Rollout(obs_space, action_space, cfg.num_steps, n, device)
        """The rollout the next (or last) update reads."""
        self.upload = Uploader(obs_space, n, device)
        obs, _ = envs.reset(seed=seed)
        # Where the envs stand: the next observations, episode starts and GRU state. Only the
        # rollout (in the background thread, when there is one) reads and writes them.
        self.next_obs = obs_to_tensor(obs, device)
        self.next_first = np.ones(n, dtype=np.float32)
        self.state = self.policy.initial_state(n, device)
        self.values_after_rollout = not self.policy.shared
        """A separate critic MLP values the whole rollout in one batched pass after it: the same
        numbers as a pass per step, without T-1 passes' per-call overhead (5% of A2C's time on
        CartPole). A shared encoder's value comes with the actor's features during the rollout."""
        self.pipelined = isinstance(envs, GroupedVectorEnv) and len(envs.groups) > 1
        """Whether the rollout pipelines the worker groups (`_collect`): where the envs were made in
        groups for it (hpcrl.rl.algorithms.pipelines_envs says where: on a GPU)."""
        self.async_rollout = cfg.async_rollout is True or (cfg.async_rollout == "auto" and isinstance(envs, GroupedVectorEnv))
        self._spare: Rollout | None = None
        self._thread: RolloutThread | None = None
        self._generator: torch.Generator | None = None
        self._yielding: YieldingUpdate | None = None
        """On a CPU, the thread that runs the update at background priority beside a rollout in flight."""
        self._learner: LearnerProcess | None = None
        """Where it pays (`_learner_process_pays`), the process that does so instead, once it is ready."""
        self._beside = False
        """Whether updates beside the rollout have gone to the learner process (it was ready)."""
        self._pace = FasterOfTwo()
        """Whether the update yields the cores to the rollout: yes, unless it outlasts the rollout and
        normal priority was measured faster in this run."""
        self._rollout_began = 0.0
        self._paced: tuple[float, float] | None = None
        """(when the rollout beside the last update `_pace` chose for began, the seconds that update ran on after
        the rollout was done): `_pace` records how long both took once the rollout is waited for."""
        self._graphs: dict[tuple[int, int], graphs.GraphedStep] = {}
        """The rollout's CUDA graphs, one per (acting policy, env group), made on first use."""
        if self.async_rollout:
            self._spare = Rollout(obs_space, action_space, cfg.num_steps, n, device)
            self.behaviour = cast_for_acting(copy.deepcopy(self.policy), device)
            """The weights the background rollout acts with: the policy as it was when the rollout began."""
            self._generator = torch.Generator(device)

    @staticmethod
    def make_policy(cfg: OnPolicyConfig, obs_space: gym.Space, action_space: gym.Space) -> ActorCritic:
        """The network evaluation rebuilds from a checkpoint's `policy` weights."""
        return ActorCritic(obs_space, action_space, cfg.hidden_sizes, cfg.activation, cfg.recurrent_size, cfg.normalize_obs, cfg.amp, cfg.cnn_channels)

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> FlatOptimizer:
        return Adam(params, lr=self.cfg.lr, eps=1e-5)

    def sync_policy(self) -> None:
        """Rank 0's weights and observation statistics on every rank (at the start, after a resume)."""
        self.ranks.broadcast_(self.gradient_step.flat.data)
        for buffer in self.policy.buffers():
            self.ranks.broadcast_(buffer)

    @property
    def finished(self) -> bool:
        return self.iteration >= self.num_iterations

    # The rollout the update reads, by the names the update and the tests use.
    obs = property(lambda self: self.rollout.obs)
    actions = property(lambda self: self.rollout.actions)
    logprobs = property(lambda self: self.rollout.logprobs)
    values = property(lambda self: self.rollout.values)
    rewards = property(lambda self: self.rollout.rewards)
    firsts = property(lambda self: self.rollout.firsts)
    rollout_state = property(lambda self: self.rollout.start_state)

    def _firsts_tensor(self, firsts: np.ndarray) -> torch.Tensor | None:
        """Episode starts as the GRU needs them; feed-forward policies take none."""
        return torch.as_tensor(firsts, device=self.device) if self.policy.gru is not None else None

    # ---------------------------------------------------------------- rollout
    def collect(self) -> None:
        """One rollout with the current policy into `self.rollout`, in this thread (the
        synchronous path; the background thread runs `_collect` with the behaviour policy)."""
        self._collect(self.rollout, self.policy)
        self.episodes.extend(self.rollout.episodes)

    @torch.no_grad()
    def _collect(self, buf: Rollout, policy: ActorCritic, generator: torch.Generator | None = None) -> None:
        """`num_steps` vector steps of every env into `buf`, acting with `policy`. Envs in worker
        groups (GroupedVectorEnv) are pipelined where `self.pipelined`: each group's actions are sent
        as soon as its forward pass is done, and the next group's forward pass runs while those workers step.
        Every env gets the same observations, actions and states as with one batched forward pass
        per vector step; only the order of the random draws between envs changes."""
        cfg = self.cfg
        buf.start_state = self.state
        buf.episodes = []
        envs = self.envs
        act = lambda step, part, k, states: self._act(buf, policy, generator, step, part, k, states)  # noqa: E731
        receive = lambda step, part, k, states, outcome: self._receive(buf, policy, step, part, k, states, outcome)  # noqa: E731
        if not self.pipelined:  # one batch per vector step, nothing to slice
            states = [self.state]
            with self._rollout_threads():
                for step in range(cfg.num_steps):
                    receive(step, ALL, 0, states, envs.step(act(step, ALL, 0, states)))
            self.state = states[0]
        else:
            parts = envs.slices
            states = [None if self.state is None else self.state[:, part] for part in parts]
            with self._rollout_threads():
                for step in range(cfg.num_steps):
                    for k, part in enumerate(parts):
                        if step > 0:
                            receive(step - 1, part, k, states, envs.receive(k))
                        envs.send(k, act(step, part, k, states))
                for k, part in enumerate(parts):
                    receive(cfg.num_steps - 1, part, k, states, envs.receive(k))
            self.state = None if self.state is None else torch.cat(states, dim=1)
        if self.values_after_rollout:
            buf.values.copy_(policy.value(buf.obs.flatten(0, 1)).view_as(buf.values))
        # GAE's bootstrap, from the policy that acted, where the envs stand now.
        buf.next_value = policy.value(self.next_obs, self.state, self._firsts_tensor(self.next_first)).cpu().numpy()
        buf.next_first = self.next_first.copy()

    def _act(self, buf: Rollout, policy: ActorCritic, generator: torch.Generator | None, step: int, part: slice, k: int, states: list[torch.Tensor | None]) -> np.ndarray:
        """Store the observations of envs `part` (group k) at `step` and act on them: the actions to send."""
        obs = self.next_obs if part is ALL else _map(lambda x: x[part], self.next_obs)
        _write(buf.obs, step if part is ALL else (step, part), obs)
        firsts = self.next_first if part is ALL else self.next_first[part]
        buf.firsts[step, part] = firsts
        if self.cfg.cuda_graph and graphs.usable(policy, self.device):
            noise = policy.actor_head.draw(len(firsts), self.device, generator)
            key = (id(policy), k)
            if key not in self._graphs:
                self._graphs[key] = graphs.GraphedStep(policy, obs, not self.values_after_rollout, noise)
            action, logprob, value = self._graphs[key](obs, noise)
        else:
            action, logprob, value, states[k] = policy.step(obs, states[k], self._firsts_tensor(firsts), with_value=not self.values_after_rollout, generator=generator)
        buf.actions[step, part] = action
        buf.logprobs[step, part] = logprob
        if value is not None:
            buf.values[step, part] = value
        return policy.clip_action(action).cpu().numpy()

    def _receive(self, buf: Rollout, policy: ActorCritic, step: int, part: slice, k: int, states: list[torch.Tensor | None], outcome: tuple) -> None:
        """Store what the actions of envs `part` (group k) at `step` led to: `outcome` is their vector step."""
        cfg = self.cfg
        obs, reward, terminated, truncated, info = outcome
        reward = reward.astype(np.float32) * cfg.reward_scale
        cut = truncated & ~terminated
        if cut.any():
            # A time limit is not a terminal state: bootstrap from the value of the last observation.
            last = _map(lambda x, cut=cut: x[torch.as_tensor(cut, device=self.device)], obs_to_tensor(final_observations(obs, info), self.device))
            state = states[k][:, torch.as_tensor(cut, device=self.device)] if states[k] is not None else None
            reward[cut] += cfg.gamma * policy.value(last, state, self._firsts_tensor(np.zeros(int(cut.sum()), np.float32))).cpu().numpy()
        buf.rewards[step, part] = reward
        if part is ALL:
            self.next_obs = self.upload(obs)
            self.next_first = (terminated | truncated).astype(np.float32)
        else:
            _write(self.next_obs, part, self.upload(obs, part))
            self.next_first[part] = terminated | truncated
        returns, lengths = finished_episodes(info)
        buf.episodes.extend(zip(returns.tolist(), lengths.tolist()))

    def _torch_threads(self) -> tuple[int, int]:
        """(threads while the env workers step, threads while they are idle) on the cores this
        process may use.

        While the workers step every worker process wants a core: the forward passes get the
        cores the workers leave (at least one), else the intra-op threads wait on each other at
        every op while workers hold their cores (a rollout ran 2-8x slower with 2 threads on 2
        cores than with 1). The update (workers idle, unless the rollout runs in the background)
        takes train.torch_threads, but not more threads than cores."""
        threads, cores = self.cfg.torch_threads, usable_cores()
        workers = self.num_envs if isinstance(self.envs, GroupedVectorEnv) else 0
        return max(1, min(threads, cores - workers)), min(threads, cores)

    @contextlib.contextmanager
    def _rollout_threads(self) -> Iterator[None]:
        """The rollout's torch threads (see `_torch_threads`) for a synchronous rollout. (Torch's
        thread count is the process's: with a background rollout, rollout and update keep the
        count for stepping workers throughout.)"""
        if self.async_rollout:
            yield
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(self._torch_threads()[0])
        try:
            yield
        finally:
            torch.set_num_threads(min(threads, usable_cores()))

    def _next_rollout(self) -> Rollout:
        """The rollout of this iteration: collected now (synchronous), or the one the background
        thread filled during the last update, after the next one is started."""
        if not self.async_rollout:
            self.collect()
            return self.rollout
        if self._thread is None:
            # Started on the first iteration (also of a resumed run), so that a checkpoint loaded
            # after construction is what the first rollout acts with.
            torch.set_num_threads(self._torch_threads()[0])  # the update overlaps the workers' steps from now on
            finished = None
            if self.device.type == "cpu":
                self._yielding = YieldingUpdate.start()
                if self._yielding is not None and self._learner_process_pays():
                    with contextlib.suppress(OSError, subprocess.SubprocessError):  # no shared memory or process to be had: the thread does it
                        self._learner = LearnerProcess(self)
                        finished = self._learner.finished
            self._thread = RolloutThread(lambda buf: self._collect(buf, self.behaviour, self._generator), self.device, finished)
            self._start(self.rollout)
        buf = self._thread.wait()
        if self._paced is not None:  # the rollout and the update beside it are both done
            began, tail = self._paced
            self._pace.record(time.perf_counter() - began, tail)
            self._paced = None
        self.episodes.extend(buf.episodes)
        if self.iteration + 1 < self.num_iterations:
            spare = self._spare
            self._spare = buf
            self._start(spare)
        return buf

    def _start(self, buf: Rollout) -> None:
        """The background rollout into `buf`, acting with the policy as it is now."""
        assert self._thread is not None and self._generator is not None
        with torch.no_grad():
            for mine, theirs in zip(self.behaviour.parameters(), self.policy.parameters()):
                mine.copy_(theirs)
            for mine, theirs in zip(self.behaviour.buffers(), self.policy.buffers()):
                mine.copy_(theirs)
        # The rollout's action draws: seeded from the main RNG at this point of the run, so a run
        # is the same whatever the timing of the two threads, and a resumed run reseeds alike.
        self._generator.manual_seed(int(torch.randint(2**62, (1,))))
        self._rollout_began = time.perf_counter()
        self._thread.start(buf)

    def close(self) -> None:
        """End the background rollout (a rollout in flight is discarded): before closing the envs."""
        if self._thread is not None:
            self._thread.close()
            self._thread = None
        if self._yielding is not None:
            self._yielding.close()
            self._yielding = None
        if self._learner is not None:
            self._learner.close()
            self._learner = None

    def _learner_process_pays(self) -> bool:
        """Whether the update beside the rollout goes to a learner process once it has started:
        one that can be taken up where the process stopped, on one rank (the ranks' collectives are
        this process's) without a GRU, of a CNN or of a run long enough to be worth a process's start."""
        long = is_image(self.envs.single_observation_space) or self.num_iterations >= LEARNER_PROCESS_ITERATIONS
        return self.resumable_update and not self.ranks.distributed and self.policy.gru is None and long

    def learner_setup(self) -> dict[str, Any]:
        """What `learner_replica` builds a replica of this agent's learning parts from."""
        return {"cfg": self.cfg, "obs_space": self.envs.single_observation_space, "action_space": self.envs.single_action_space, "num_envs": self.num_envs}

    def learner_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors an update writes or reads besides its batch, by name."""
        step = {f"step.{k}": v for k, v in self.gradient_step.tensors().items()}
        buffers = {f"buffer.{i}": b for i, b in enumerate(self.policy.buffers())}
        return {**step, **buffers, "losses_finite": self.losses_finite}

    def bind_learner(self, tensors: dict[str, torch.Tensor]) -> None:
        """Work on `tensors` (as `learner_tensors` names them: copies in shared memory) from now on."""
        self.gradient_step.bind({k.removeprefix("step."): v for k, v in tensors.items() if k.startswith("step.")})
        for i, buffer in enumerate(self.policy.buffers()):
            buffer.data = tensors[f"buffer.{i}"]
        self.losses_finite = tensors["losses_finite"]

    @classmethod
    def learner_replica(cls, setup: dict[str, Any], tensors: dict[str, torch.Tensor]) -> OnPolicyAgent:
        """The learning parts of an agent without its envs, on `tensors` (`learner_tensors`'
        names): what `update_steps` reads, in the learner process."""
        agent = cls.__new__(cls)
        agent.cfg, agent.device, agent.ranks = setup["cfg"], torch.device("cpu"), Ranks.single()
        agent.policy = cls.make_policy(agent.cfg, setup["obs_space"], setup["action_space"])
        agent.gradient_step = GradientStep(agent.policy.parameters(), agent.make_optimizer, agent.cfg.max_grad_norm, agent.cfg.amp, agent.device)
        agent.losses_finite = torch.ones((), dtype=torch.bool)
        agent.bind_learner(tensors)
        agent.num_envs, agent.iteration, agent.num_iterations = setup["num_envs"], 0, 1  # the two set by each update
        agent.batch_size = agent.num_envs * agent.cfg.num_steps
        return agent

    @torch.no_grad()
    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.rollout
        values = buf.values.cpu().numpy()
        adv = gae(buf.rewards, values, buf.firsts, buf.next_value, buf.next_first, self.cfg.gamma, self.cfg.gae_lambda)
        return torch.as_tensor(adv, device=self.device), torch.as_tensor(adv + values, device=self.device)

    def batch(self, adv: torch.Tensor, returns: torch.Tensor) -> dict[str, Any]:
        """The rollout flattened time-major (row t * num_envs + env), as the GRU replays it."""
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
        return {
            "obs": _map(flat, self.obs),
            "actions": flat(self.actions),
            "logprobs": flat(self.logprobs),
            "values": flat(self.values),
            "adv": flat(adv),
            "returns": flat(returns),
            "firsts": flat(torch.as_tensor(self.firsts, device=self.device)),
        }

    def minibatches(self, count: int) -> Iterator[tuple[Any, torch.Tensor | None]]:
        """(row index, GRU state at the rollout start) per minibatch. Feed-forward minibatches are
        random transitions; recurrent ones are whole env sequences, so the GRU can be replayed."""
        if count == 1:
            yield slice(None), self.rollout_state if self.policy.gru is not None else None
        elif self.policy.gru is None:
            size = max(1, self.batch_size // count)
            perm = torch.randperm(self.batch_size, device=self.device)
            for start in range(0, self.batch_size, size):
                yield perm[start : start + size], None
        else:
            per = max(1, self.num_envs // count)
            envs = torch.randperm(self.num_envs, device=self.device)
            rows = torch.arange(self.cfg.num_steps, device=self.device)[:, None] * self.num_envs
            for start in range(0, self.num_envs, per):
                chosen = envs[start : start + per]
                yield (rows + chosen[None, :]).reshape(-1), self.rollout_state[:, chosen]

    # ---------------------------------------------------------------- the iteration
    def train_iteration(self) -> dict[str, float]:
        cfg = self.cfg
        lr = cfg.lr * (1.0 - self.iteration / self.num_iterations) if cfg.anneal_lr else cfg.lr
        self.gradient_step.set_lr(lr)
        self.rollout = self._next_rollout()
        self.global_step += self.steps_per_iteration
        adv, returns = self.advantages()
        batch = self.batch(adv, returns)
        if self._yielding is not None and self._thread is not None and self._thread.in_flight is not None:
            beside = self._learner is not None and self._learner.ready()
            if beside and not self._beside:  # the background way is another from now on: measure both again
                self._beside = True
                self._pace.restart()
            if (self._learner is not None and not beside) or not self._pace.choose():
                # At normal priority; and while the learner process starts, not in the background thread, whose step
                # under way when the rollout ended held the trainer up until other work of normal priority on every
                # core ended (a test's update waited 115 s beside four busy loops on 2 cores), and which would take
                # the idle cores the process starts on.
                metrics = self.update(batch)
            elif beside:
                metrics = self._update_beside(batch, lr)
            else:
                metrics = self._yielding(self.update_steps(batch), self._thread.finished)
            self._paced = (self._rollout_began, self._thread.since_finished())
        else:
            metrics = self.update(batch)
        if not self.losses_finite:
            raise FloatingPointError(f"non-finite loss at step {self.global_step} (iteration {self.iteration + 1}): lower train.lr or look for NaN rewards")
        if self.policy.obs_norm is not None:
            # After the update, so the rollout and its update saw the same statistics.
            self.policy.obs_norm.update(self.obs, self.ranks.moments)
        self.iteration += 1
        return {**metrics, "lr": lr}

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """One update from `batch`, in this thread: its metrics for the log."""
        return run_to_end(self.update_steps(batch))

    def _update_beside(self, batch: dict[str, Any], lr: float) -> dict[str, float]:
        """One update from `batch`, begun in the learner process while the rollout is in flight,
        and finished here at normal priority where the rollout ended first (all of it here where the
        process answered late or is still on an update given up on): its metrics."""
        assert self._learner is not None
        finished, value = self._learner(batch, self.iteration, self.num_iterations, lr, self._thread.since_finished)
        if finished:
            return value
        done, clipped = value
        return run_to_end(self.update_steps(batch, done, torch.tensor(clipped, device=self.device)))

    def update_steps(self, batch: dict[str, Any]) -> Generator[None, None, dict[str, float]]:
        """The update as a generator that yields between its gradient steps (A2C after its one) and
        returns its metrics: where an update at background priority hands over to the main thread
        (`YieldingUpdate`)."""
        raise NotImplementedError

    def step_with_entropy(self, loss: torch.Tensor, params: Any) -> None:
        """One gradient step on `loss - ent_coef * entropy`. With ent_coef 0 the entropy term
        (exact zeros in the gradient) stays out of the graph altogether."""
        if self.cfg.ent_coef != 0.0:
            loss = loss - self.cfg.ent_coef * self.policy.actor_head.entropy(params).mean()
        self.losses_finite &= torch.isfinite(loss)
        self.gradient_step(loss)

    @torch.no_grad()
    def mean_entropy(self, params: Any) -> torch.Tensor:
        """The policy's mean entropy for the log, from distribution parameters of an update."""
        detached = tuple(p.detach() for p in params) if isinstance(params, tuple) else params.detach()
        return self.policy.actor_head.entropy(detached).mean()

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Weights (with observation statistics), optimiser and counters: the state at an
        iteration boundary. The envs, the GRU state and a background rollout in flight are not
        saved: a resumed run resets its envs, starts every episode afresh, and collects its next
        rollout with the saved policy (the in-flight one, never updated from, is discarded;
        global_step counts only rollouts updated from)."""
        return {
            "policy": self.policy.state_dict(),
            **self.gradient_step.state_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError("load_state_dict after training began: load a checkpoint before the first iteration")
        self.policy.load_state_dict(state["policy"])
        self.gradient_step.load_state_dict(state)
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])


class PPO(OnPolicyAgent):
    metric_names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "lr")
    cfg: PPOConfig
    resumable_update = True

    def update_steps(self, batch: dict[str, Any], start: int = 0, clipped: torch.Tensor | None = None) -> Generator[tuple[int, torch.Tensor], None, dict[str, float]]:
        """The update's gradient steps; between two of them it yields (steps done, samples clipped
        so far). With `start` > 0 the first `start` steps were made elsewhere on these same weights
        (the learner process, `hpcrl.rl.learner_process`), and `clipped` counts their clipped
        samples: they are skipped here, their minibatches drawn all the same, so the update is the
        same numbers wherever each of its steps ran."""
        cfg = self.cfg
        clip = cfg.clip_coef * (1.0 - self.iteration / self.num_iterations) if cfg.anneal_clip else cfg.clip_coef

        def neg_advantages(adv: torch.Tensor) -> torch.Tensor:
            if cfg.norm_adv and len(adv) > 1:
                mean, std = self.ranks.mean_std(adv)
                adv = (adv - mean) / (std + 1e-8)
            return -adv

        # With one minibatch (the whole batch), its normalised advantages are the same every epoch.
        whole_neg_adv = neg_advantages(batch["adv"]) if cfg.num_minibatches == 1 else None
        # Diagnostics (approx_kl, entropy) come from the last minibatch after the epochs, not from a
        # handful of extra ops in every minibatch; clipfrac from a running count of clipped samples.
        clipped = torch.zeros((), device=self.device) if clipped is None else clipped.to(self.device)
        done = samples = 0
        for _ in range(cfg.update_epochs):
            for mb, state in self.minibatches(cfg.num_minibatches):
                done += 1
                samples += self.batch_size if isinstance(mb, slice) else len(mb)
                if done <= start:
                    continue
                if done > start + 1:
                    yield done - 1, clipped
                # No view ops for the whole batch; a minibatch's rows by `index_select`, which copies whole rows:
                # `x[mb]` indexes element by element (64 of 512 80x60 frames: 177 against 9 us of CPU).
                take = (lambda x: x) if isinstance(mb, slice) else (lambda x, mb=mb: x.index_select(0, mb))
                firsts = take(batch["firsts"]) if state is not None else None
                newlogprob, params, newvalue = self.policy.evaluate_params(_map(take, batch["obs"]), take(batch["actions"]), state, firsts)
                logratio = newlogprob - take(batch["logprobs"])
                ratio = logratio.exp()
                clipped += ((ratio.detach() - 1.0).abs() > clip).sum()
                neg_adv = whole_neg_adv if whole_neg_adv is not None else neg_advantages(take(batch["adv"]))
                pg_loss = torch.max(neg_adv * ratio, neg_adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                returns, old_values = take(batch["returns"]), take(batch["values"])
                if cfg.clip_vloss:
                    v_clipped = old_values + (newvalue - old_values).clamp(-clip, clip)
                    v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
                self.step_with_entropy(pg_loss + cfg.vf_coef * v_loss, params)
            # The epoch's last step decides whether to stop, where it ran (an epoch done elsewhere passed there).
            if done > start and cfg.target_kl is not None and self.ranks.any(bool(_approx_kl(logratio) > cfg.target_kl)):
                break  # on every rank at once: the ranks' updates stay in step
        return {
            "policy_loss": pg_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": self.mean_entropy(params).item(),
            "approx_kl": _approx_kl(logratio).item(),
            "clipfrac": (clipped / samples).item(),  # of all samples of all epochs
        }


@torch.no_grad()
def _approx_kl(logratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(old || new) from log(new / old) of the sampled actions."""
    return (logratio.exp() - 1 - logratio).mean()
