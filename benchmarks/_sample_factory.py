"""benchmarks/vizdoom_speed.py's `sample-factory` side: Sample Factory 2.1.1's APPO on hpcrl's scenario, frame and
network, run by the measurement's child in Sample Factory's own venv (no hpcrl there: the settings arrive as JSON,
made by `vizdoom_speed.sf_settings` in hpcrl's environment). vizdoom_speed.py's docstring says which of Sample
Factory's settings match hpcrl's and which differ, and why."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from typing import Any

import _args
from _window import PARTS, cpu_seconds, return_fields, window


def _env(full_env_name: str, cfg: Any, env_config: Any, render_mode: str | None = None) -> Any:
    """Sample Factory's own Doom env (sf_examples' VizdoomEnv and wrappers) on hpcrl's scenario file
    from ViZDoom's package, its frame skip, resolution, and the same downsampled grey frame
    (area interpolation: the mean of each block, as hpcrl's adapter takes it)."""
    import vizdoom
    from gymnasium.spaces import Discrete
    from sample_factory.envs.env_wrappers import PixelFormatChwWrapper, ResizeWrapper
    from sf_examples.vizdoom.doom.doom_gym import VizdoomEnv
    from sf_examples.vizdoom.doom.wrappers.observation_space import SetResolutionWrapper

    env = VizdoomEnv(Discrete(4), os.path.join(vizdoom.scenarios_path, cfg.hpcrl_scenario), skip_frames=cfg.env_frameskip, render_mode=render_mode)
    env = SetResolutionWrapper(env, cfg.hpcrl_resolution)
    env = ResizeWrapper(env, cfg.res_w, cfg.res_h, grayscale=True, add_channel_dim=True, area_interpolation=True)
    return PixelFormatChwWrapper(env) if cfg.pixel_format == "CHW" else env


def _encoder(cfg: Any, obs_space: Any) -> Any:
    """hpcrl's CNN for Sample Factory: the Nature CNN's layout with train.cnn_channels' filters, then
    one hidden layer (train.hidden_sizes), built from Sample Factory's own conv encoder parts."""
    from sample_factory.model.encoder import ConvEncoderImpl, Encoder
    from sample_factory.model.model_utils import nonlinearity

    class HpcrlCNN(Encoder):
        def __init__(self, cfg: Any, obs_space: Any) -> None:
            super().__init__(cfg)
            shape = obs_space["obs"].shape
            c1, c2, c3 = cfg.hpcrl_cnn
            filters = [[shape[0], c1, 8, 4], [c1, c2, 4, 2], [c2, c3, 3, 1]]
            self.enc = ConvEncoderImpl(shape, filters, [cfg.hpcrl_hidden], nonlinearity(cfg))
            self.out = cfg.hpcrl_hidden

        def forward(self, obs_dict: Any) -> Any:
            return self.enc(obs_dict["obs"])

        def get_out_size(self) -> int:
            return self.out

    return HpcrlCNN(cfg, obs_space)


def measure_sample_factory(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    """Sample Factory's APPO (its ParallelRunner: rollout workers, an inference worker and a learner in
    processes of their own) on hpcrl's env and network; the steps its learner trained on, per second."""
    from sample_factory.algo.runners import runner as runner_module
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.context import global_model_factory
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from sf_examples.vizdoom.doom.doom_params import add_doom_env_args, doom_override_defaults

    s = settings
    if s["gpu"] is not None:  # before CUDA starts in any of its processes: they inherit it
        os.environ["CUDA_VISIBLE_DEVICES"] = s["gpu"]
    per_worker = s["num_envs"] // s["workers"]
    train_dir = args.scratch  # its checkpoints too, in the measurement's scratch folder (its TMPDIR: a short path, see `run_child`)
    os.chdir(train_dir)  # ViZDoom's engines write ./_vizdoom* here; `run_child` removes the folder, however this ended
    # Each engine checks for ./_vizdoom/, then creates it: two of its rollout workers starting their games at once
    # raced on it, and the loser died in game.init() ("Failed to create ./_vizdoom/ directory: File exists", then
    # SIGSEGV: 3 of 13 measurements here), leaving Sample Factory to run on its other worker's envs at about half its rate.
    # hpcrl's games each start in a folder of their own (hpcrl.rl.vizdoom_env.OwnDirectory); here the folder is
    # made before any game starts.
    os.makedirs("_vizdoom", exist_ok=True)
    learn = args.learn or 10**9
    argv = [
        "--env=hpcrl_doom", "--experiment=sf", f"--train_dir={train_dir}", f"--device={'cpu' if s['gpu'] is None else 'gpu'}", f"--seed={s['seed']}",
        f"--num_workers={s['workers']}", f"--num_envs_per_worker={per_worker}", f"--worker_num_splits={2 if per_worker % 2 == 0 else 1}",
        f"--rollout={s['rollout']}", f"--batch_size={s['minibatch']}", f"--num_batches_per_epoch={s['minibatches']}",
        f"--num_epochs={s['epochs']}", f"--learning_rate={s['lr']}", f"--gamma={s['gamma']}", f"--gae_lambda={s['gae_lambda']}",
        f"--ppo_clip_ratio={s['clip']}", f"--ppo_clip_value={s['clip_value']}", "--exploration_loss=entropy", f"--exploration_loss_coeff={s['ent_coef']}",
        f"--value_loss_coeff={s['vf_coef']}", f"--max_grad_norm={s['max_grad_norm']}", f"--reward_scale={s['reward_scale']}", "--adam_eps=1e-5",
        "--normalize_input=False", "--normalize_returns=False", "--shuffle_minibatches=True", "--obs_scale=255.0", "--use_rnn=False", f"--nonlinearity={s['activation']}",
        f"--env_frameskip={s['frame_skip']}", f"--res_w={s['width']}", f"--res_h={s['height']}", "--summaries_use_frameskip=False",
        f"--train_for_env_steps={learn}", "--save_every_sec=100000", "--save_best_every_sec=100000", f"--save_best_after={2**62}",
        "--experiment_summaries_interval=100000",
        f"--hpcrl_scenario={s['scenario']}", f"--hpcrl_resolution={s['resolution']}", f"--hpcrl_hidden={s['hidden']}",
        "--hpcrl_cnn", *map(str, s["cnn_channels"]),
    ]  # fmt: skip
    parser, _ = parse_sf_args(argv=argv)
    add_doom_env_args(parser)
    doom_override_defaults(parser)
    parser.add_argument("--hpcrl_scenario")
    parser.add_argument("--hpcrl_resolution")
    parser.add_argument("--hpcrl_hidden", type=_args.positive_integer)
    parser.add_argument("--hpcrl_cnn", type=_args.positive_integer, nargs=3)
    cfg = parse_full_cfg(parser, argv)
    # Its learner's schedules include a linear decay to 0 over train_for_env_steps (learner.LinearDecayScheduler),
    # which 2.1.1's argument parser does not offer among --lr_schedule's choices: set on the parsed config.
    cfg.lr_schedule = s["lr_schedule"]
    register_env("hpcrl_doom", _env)
    global_model_factory().register_encoder_factory(_encoder)

    class Clock(AlgoObserver):
        """(time, env steps trained on) after each training iteration; stops a timed run."""

        def __init__(self) -> None:
            self.marks: list[tuple[float, int, Any, int]] = []
            self.ended = 0
            self.died: list[str] = []
            self.stopped_in_time = False
            """Whether the runner was stopped as a run ends (its time or steps up), before any of its processes died."""

        def episode(self, runner: Any, msg: Any, policy_id: Any) -> None:
            """Its rollout workers' report of one finished episode."""
            self.ended += 1

        def on_start(self, runner: Any) -> None:
            """A watch on its processes, once a second: its runner outlives a rollout worker that died (an exception
            in its event loop, numpy 2 under 2.1.1's) and waits for frames for ever; the watch ends the run instead."""
            from signal_slot.signal_slot import EventLoopObject, Timer

            clock = self

            class Watch(EventLoopObject):  # a timer's slot must be a method of one
                def look(self) -> None:
                    dead = [f"{p.name} ({_how(p.exitcode)})" for p in _processes(runner) if p.exitcode is not None]
                    if dead and not runner.stopped:  # once stopped, its processes end as they should
                        clock.died = dead
                        runner._stop_training(failed=True)

            self.watch = Watch(runner.event_loop, "hpcrl_watch")
            self.timer = Timer(runner.event_loop, 1.0)
            self.timer.timeout.connect(self.watch.look)

        def on_stop(self, runner: Any) -> None:
            self.stopped_in_time = not self.died

        def on_training_step(self, runner: Any, training_iteration_since_resume: int) -> None:
            if not PARTS["processes"]:  # its learner, inference worker and rollout workers (which host the envs)
                roles = {"learner_proc": "learner", "inference_proc": "inference", "rollout_proc": "env workers"}
                for p in _processes(runner):
                    PARTS["processes"][p.pid] = next((part for prefix, part in roles.items() if p.name.startswith(prefix)), "main")
            self.marks.append((time.perf_counter(), sum(runner.env_steps.values()), cpu_seconds(), self.ended))
            if not args.learn and len(self.marks) > 1 and self.marks[-1][0] - self.marks[1][0] >= args.seconds:
                runner._stop_training()

    runner_module.obtain_env_info_in_a_separate_process = _env_info  # its init's wait, bounded (see `_env_info`)
    cfg, runner = make_runner(cfg)
    clock = Clock()
    runner.register_observer(clock)
    runner.register_episodic_stats_handler(clock.episode)
    finished = threading.Event()
    threading.Thread(target=_end_if_stuck, args=(runner, clock, finished), name="hpcrl_stuck_watch", daemon=True).start()
    try:
        succeeded = runner.init() == ExperimentStatus.SUCCESS and runner.run() == ExperimentStatus.SUCCESS
    finally:
        finished.set()
    if not succeeded:
        raise RuntimeError(f"Sample Factory's {', '.join(clock.died)} died mid-run" if clock.died else "Sample Factory's runner did not succeed")
    if len(clock.marks) < 3:
        raise RuntimeError(f"Sample Factory did not finish one timed iteration in {args.seconds} s")
    (start, first, cpu0, ended0), (end, last, cpu1, ended1) = clock.marks[1], clock.marks[-1]
    if last == first:  # a setting its learner cannot batch: it "trains" on nothing, at once and for ever
        raise RuntimeError(f"Sample Factory's learner trained on no environment step in {end - start:.1f} s")
    result = {**window(last - first, end - start, ended1 - ended0, (cpu0, cpu1)), "device": args.device, "torch_threads": 1, "amp": "none", "layout": f"{s['workers']} workers x {per_worker} envs"}
    if args.learn:
        result.update(total_steps=last, **_final_policy_fields(cfg, args.eval_episodes))
    return result


def _processes(runner: Any) -> list[Any]:
    """Sample Factory's processes: its learner's, and its sampler's (inference and rollout workers) once it has one."""
    return [*runner.processes, *(runner.sampler.processes if runner.sampler is not None else [])]


STOP_GRACE_S = 15.0
"""How long Sample Factory's runner has to stop once one of its processes died mid-run."""


def _end_if_stuck(runner: Any, clock: Any, finished: threading.Event) -> None:
    """End this measurement, saying which process died, when one of Sample Factory's processes died mid-run and
    its runner has not stopped STOP_GRACE_S later. The watch on its event loop (`Clock.on_start`) stops the runner
    once it runs, but its stop waits for every live process, and a start (`sampler.init`, where its games start)
    waits for its workers: under a load of 7 a killed rollout worker's runner had not stopped 60 s later, in the
    fresh suite at 1be43f4. A thread of its own, from before the runner starts its processes, reading their exit
    codes once a second; the benchmark then ends what is left of the session."""
    ended: list[Any] = []
    while not ended:  # by exit code (a reaped child), not sentinel: a worker's game inherits the sentinel's pipe
        ended = [p for p in _processes(runner) if p.exitcode is not None]
        if finished.wait(1.0):
            return
    if clock.stopped_in_time or finished.wait(STOP_GRACE_S):  # ended as its run does, or the runner stopped
        return
    dead = ", ".join(f"{p.name} ({_how(p.exitcode)})" for p in ended)
    print(f"RuntimeError: Sample Factory's {dead} died mid-run, and its runner did not stop within {STOP_GRACE_S:g} s", file=sys.stderr, flush=True)
    os._exit(1)


def _env_info(cfg: Any) -> Any:
    """Sample Factory's `obtain_env_info_in_a_separate_process` (its env's spaces, read in a process of its own
    before its runner starts) with the wait bounded by the process's life: 2.1.1's waits on its queue for ever, so
    a kill of that process (or a crash in its game's start) left the side hanging until the measurement's timeout
    (the CI run of 534bb1a, under a load of 7). Same process, same target, no cache (Sample Factory's default):
    its runner gets the same EnvInfo."""
    from sample_factory.algo.utils.context import sf_global_context
    from sample_factory.algo.utils.env_info import spawn_tmp_env_and_get_info

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=spawn_tmp_env_and_get_info, args=(sf_global_context(), results, cfg), name="env_info")
    process.start()
    while True:
        gone = process.exitcode is not None  # read before the wait: a result put before its exit is in the pipe by then
        try:
            info = results.get(timeout=1.0)
            break
        except queue.Empty:
            if gone:
                raise RuntimeError(f"Sample Factory's env_info process ({_how(process.exitcode)}) died before its run started") from None
    process.join()
    return info


def _how(exitcode: int) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    return f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"


def _final_policy_fields(cfg: Any, episodes: int) -> dict[str, float | None]:
    """The row fields of Sample Factory's final policy: its return over `episodes` episodes, sampling its actions
    (`return_fields`, as every side's), and the learning rate its learner had reached (its checkpoint's
    `final_lr`): what says its schedule ran as hpcrl's."""
    import torch
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.model.actor_critic import create_actor_critic

    env = _env("hpcrl_doom", cfg, None)
    policy = create_actor_critic(cfg, _dict_space(env.observation_space), env.action_space)
    checkpoint = last_checkpoint(Learner.checkpoint_dir(cfg, 0))
    policy.load_state_dict(checkpoint["model"])
    policy.eval()
    rnn = torch.zeros(1, 1)

    def act(obs: Any) -> int:
        with torch.no_grad():
            out = policy(prepare_and_normalize_obs(policy, {"obs": torch.as_tensor(obs)[None]}), rnn)
        return int(out["actions"][0])

    try:
        return {**return_fields(env, act, episodes), "final_lr": float(checkpoint["curr_lr"])}
    finally:
        env.close()


def last_checkpoint(where: str) -> dict[str, Any]:
    """The last checkpoint Sample Factory's learner wrote in `where` (its names sort by training step, as its
    `Learner.get_checkpoints` sorts them), read here, not through its `Learner.load_checkpoint`, which turns any error
    into None after three tries. Where its best-policy bookkeeping ran (at its stop, past --save_best_after steps:
    100k by default, so off in `measure_sample_factory`'s argv), the checkpoint holds its best return as a numpy
    float, which torch.load's default weights_only refuses: at 200k steps the side failed so until 2026-12-07. The
    file is the one its learner just wrote, so it is read whole."""
    import glob

    import torch

    checkpoints = sorted(glob.glob(os.path.join(where, "checkpoint_*")))
    if not checkpoints:
        raise RuntimeError(f"Sample Factory's learner saved no checkpoint in {where}")
    return torch.load(checkpoints[-1], map_location="cpu", weights_only=False)


def _dict_space(space: Any) -> Any:
    import gymnasium as gym

    return gym.spaces.Dict({"obs": space})
