"""hpcrl's AlphaZero beside OpenSpiel's own, on tic-tac-toe or connect four, for equal wall time on the
same cores, both sides' networks then measured by one harness (issue 39).

    python benchmarks/openspiel_alphazero.py --game tic_tac_toe --minutes 4 --path /tmp/azcmp
    python benchmarks/openspiel_alphazero.py --game connect_four --minutes 20 --games 40 --path /tmp/azc4
    python benchmarks/openspiel_alphazero.py --game connect_four --minutes 60 --cpus 0 1 --path /tmp/azc4
    python benchmarks/openspiel_alphazero.py --game connect_four --sides hpcrl openspiel-jitted --minutes 60 --at-once --path /tmp/azc4

Sides (`--sides`, each trained in turn for `--minutes` on the cores `--cpus`, default all this process may use;
with `--at-once` all at the same time, each on its own share of `--cpus`, one core each on two, and each then
played on its own share: half the wall time for two sides, and neither side's run meets a different machine):
- `hpcrl`: configs/tictactoe_alphazero.yaml or configs/connect4_alphazero.yaml as they are (`--set`
  overrides), the AlphaZero class `hpcrl train` runs, self-play and training alternating in one process
  with train.torch_threads (1) as `hpcrl train` sets it; it stops at `--minutes` or the config's train.total_steps,
  whichever comes first.
- `openspiel-shipped`: OpenSpiel 2.0.2's example (`open_spiel.python.examples.alpha_zero`) with the
  example's own settings (nn_model resnet, nn_width 256, nn_depth 2, 40 simulations, uct_c 1.41, 2
  actors, batch 128, replay 2^13 states reused 4 times, so the learner waits for 2,048 new states a
  step, lr 1e-3), but `--evaluators 0` (its evaluator processes only take CPU from learning; hpcrl does
  not evaluate while it trains either), `--max_steps 0` (the wall time is the limit) and
  `--checkpoint_freq 1`.
- `openspiel-jitted`: the same with one change, made in this runner (a monkeypatch applied in the
  learner and in every actor process it spawns): `model_linen.Model.inference`, whose `@jax.jit` is
  commented out in OpenSpiel's source ("with it the model is much slower": jitting its inner closure as
  written would retrace on every call), compiled once per model with the legal-move mask as an argument.
  Same outputs (checked at start, to 1e-5); 85 ms of CPU a call as shipped against 2.5-2.9 ms jitted.
With two cores or more, OpenSpiel's learner (its main process) gets the first of `--cpus` to itself and
its actor processes the others (`os.sched_setaffinity` on each as it is spawned), so that it is not
starved by actors that never wait; on one core all share it, as hpcrl's single process does.

OpenSpiel's AlphaZero (JAX/Flax) cannot live in hpcrl's environment: it runs in a venv of its own that
this script builds on first use and caches (benchmarks/_venvs.py; pins below). Where that venv cannot be
built (no registry), its sides print SKIPPED with pip's reason and the rest go on.

The harness (this process, hpcrl's environment): the same games for every side, hpcrl.rl.strength's
play_match against its opponents, each colour half of the `--games`: `perfect` (minimax) for
tic-tac-toe, OpenSpiel's MCTS with random rollouts at 100 and 1,000 simulations (`mcts:100`,
`mcts:1000`: UCT c = 2, one rollout, solver on) for connect four. Each side's agent searches
`--simulations` per move with its network, no noise, the most visited move: hpcrl's MCTS for hpcrl,
OpenSpiel's MCTSBot with its AlphaZeroEvaluator (puct, its uct_c) for OpenSpiel, served from a process
in its venv, with the jitted inference for both OpenSpiel sides (the same outputs: it measures the
networks, not the speed of the shipped inference). hpcrl's tic-tac-toe is its own Python game; OpenSpiel's agents play OpenSpiel's
`tic_tac_toe` (the same rules, the same minimax). For tic-tac-toe, snapshots every `--snapshot-every`
seconds of training are also played against perfect play, so the table says when each side first lost
no game. A benchmark prints; it does not assert. Figures: README "Two-player games".

Figures (2026-11-27, issue 39; the 2-core VM shared with other sessions, load average 8-25, so wall
times are indicative and the CPU seconds each side used are given beside them). Tic-tac-toe, 3 min a
side, 40 games, 200 simulations a move: hpcrl 23,054 positions, 0 losses to perfect play from its
first snapshot (18 s of training) on; OpenSpiel shipped 4 games, jitted 60 games, no learner step
(it waits for 2,048 new states): 12 losses each with the initial network. OpenSpiel jitted alone for
12 min: 355 games, 1 learner step (at 8.5 min), 7 losses (178 CPU s). Connect four, 10 min a side,
10 games, 100 simulations: hpcrl 22,572 positions (243 CPU s), 3/10 against MCTS-100, 1/10 against
MCTS-1000; OpenSpiel jitted 66 games, no learner step (202 CPU s), 1/10 and 0/10.

Connect four, 60 min, one core each at once (2026-12-02, quiet machine, nothing else running; `--game
connect_four --sides hpcrl openspiel-jitted --minutes 60 --games 40 --at-once`): hpcrl reached its config's
budget, 400,233 positions (22,400 updates), after 2,723 s (2,656 CPU s) and stopped there: 38 won, 2 lost
of 40 against MCTS-100, 35 won, 1 drawn, 4 lost against MCTS-1000. OpenSpiel jitted, all 60 min (3,553 CPU
s): 2,017 games, 41,212 states, 19 learner steps (its last checkpoint at 3,465 s): 23 won, 1 drawn, 16
lost against MCTS-100, 5 won, 1 drawn, 34 lost against MCTS-1000. (Sequentially with two cores, OpenSpiel's
20-minute run used 1,342 CPU s: its learner waits for 2,048 new states most of the time, so one core of
its own barely helped it.)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REQUIREMENTS = ["open_spiel==2.0.2", "jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8", "chex==0.1.92", "orbax-checkpoint==0.12.8"]
"""OpenSpiel's venv (the versions its AlphaZero ran with here)."""
SIDES = ("hpcrl", "openspiel-shipped", "openspiel-jitted")
CONFIGS = {"tic_tac_toe": ROOT / "configs" / "tictactoe_alphazero.yaml", "connect_four": ROOT / "configs" / "connect4_alphazero.yaml"}
OPPONENTS = {"tic_tac_toe": ["perfect"], "connect_four": ["mcts:100", "mcts:1000"]}
JIT = "HPCRL_OPENSPIEL_JIT"
"""Set in OpenSpiel's training process: its spawned actors re-import this file as their main module,
so the patch below reaches them too."""
START_S = 300
"""The most seconds a side may take to start (imports, the first network) before its training time counts."""


# ---------------------------------------------------------------------------- OpenSpiel's venv side
def jit_inference() -> None:
    """OpenSpiel's Model.inference with its prediction compiled once per model (the issue's one change)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn
    from open_spiel.python.algorithms.alpha_zero import model_linen

    def inference(self: Any, observation: Any, legals_mask: Any) -> tuple[Any, Any]:
        predict = self.__dict__.get("_hpcrl_predict")
        if predict is None:
            apply_fn = self._state.apply_fn

            @jax.jit
            def predict(params: Any, batch_stats: Any, observation: Any, legals_mask: Any) -> tuple[Any, Any]:
                logits, value = apply_fn({"params": params, "batch_stats": batch_stats}, observation, training=False, mutable=False)
                logits = jnp.where(legals_mask, logits, jnp.full_like(logits, jnp.finfo(jnp.float32).min))
                return value, nn.softmax(logits, axis=-1)

            self._hpcrl_predict = predict
        return predict(self._state.params, self._state.batch_stats, jnp.asarray(observation, dtype=jnp.float32), jnp.asarray(legals_mask, dtype=jnp.bool))

    model_linen.Model._shipped_inference = model_linen.Model.inference
    model_linen.Model.inference = inference


if os.environ.get(JIT) == "1" and __name__ != "__main__":  # a spawned actor (this file is its __mp_main__)
    jit_inference()


def check_jit(game_name: str) -> str:
    """The jitted inference against the shipped one on a few positions: the largest difference, and each's time."""
    import numpy as np
    import pyspiel
    from open_spiel.python.algorithms.alpha_zero import alpha_zero, model_linen

    game = pyspiel.load_game(game_name)
    model = model_linen.Model.build_model("resnet", game.observation_tensor_shape(), game.num_distinct_actions(), 256, 2, 1e-4, 1e-3, "/tmp")
    del alpha_zero
    state, worst, times = game.new_initial_state(), 0.0, {"shipped": 0.0, "jitted": 0.0}
    for _ in range(4):
        obs, mask = np.asarray(state.observation_tensor()), np.asarray(state.legal_actions_mask())
        out = {}
        for name, fn in (("shipped", model_linen.Model._shipped_inference), ("jitted", model_linen.Model.inference)):
            fn(model, obs, mask)  # compile / warm
            start = time.process_time()
            out[name] = [np.asarray(x) for x in fn(model, obs, mask)]
            times[name] += (time.process_time() - start) / 4
        worst = max(worst, *(float(np.abs(a - b).max()) for a, b in zip(out["shipped"], out["jitted"])))
        state.apply_action(state.legal_actions()[0])
    if worst > 1e-5:
        raise SystemExit(f"the jitted inference differs from the shipped one by {worst:g}")
    return f"jitted inference: same outputs (max difference {worst:.1g}), {1000 * times['shipped']:.1f} ms of CPU a call shipped, {1000 * times['jitted']:.1f} jitted"


def train_openspiel(args: argparse.Namespace) -> None:
    """OpenSpiel's example in this process (the venv's Python): its learner here, its actors spawned."""
    from absl import app
    from open_spiel.python.examples import alpha_zero as example
    from open_spiel.python.utils import spawn

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        learner, actors = cpus[:1], cpus[1:]
        os.sched_setaffinity(0, learner)
        started = spawn.Process.__init__

        def pinned(self: Any, *a: Any, **kw: Any) -> None:
            started(self, *a, **kw)
            os.sched_setaffinity(self._process.pid, actors)

        spawn.Process.__init__ = pinned
        print(f"learner on CPU {learner[0]}, actors on CPUs {actors}", flush=True)
    if os.environ.get(JIT) == "1":
        jit_inference()
    sys.argv = [example.__file__, "--game", args.game, "--path", str(args.path), "--evaluators", "0", "--max_steps", "0", "--checkpoint_freq", "1", "--quiet"]
    app.run(example.main)


def serve(path: Path, simulations: int, seed: int) -> None:
    """OpenSpiel's agent for the harness, one line of JSON in, one out: `{"load": step}` loads that
    checkpoint of `path`; a list of action histories gets the agent's move in each. Every side's network
    is played with the jitted inference (the same outputs, `check_jit`): the harness measures networks,
    not the speed of OpenSpiel's inference."""
    jit_inference()
    import numpy as np
    import pyspiel
    from open_spiel.python.algorithms import mcts
    from open_spiel.python.algorithms.alpha_zero import alpha_zero
    from open_spiel.python.algorithms.alpha_zero import evaluator as evaluator_lib

    config = alpha_zero.Config(**json.loads((path / "config.json").read_text()))
    model = alpha_zero._init_model_from_config(config)
    game = pyspiel.load_game(config.game)
    evaluator = evaluator_lib.AlphaZeroEvaluator(game, model)
    bot = mcts.MCTSBot(game, config.uct_c, simulations, evaluator, solve=False, child_selection_fn=mcts.SearchNode.puct_value,
                       random_state=np.random.RandomState(seed))  # fmt: skip
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if isinstance(request, dict):
            model.load_checkpoint(request["load"])
            evaluator.clear_cache()
            print("[]", flush=True)
            continue
        actions = []
        for history in request:
            state = game.new_initial_state()
            for a in history:
                state.apply_action(a)
            actions.append(int(bot.step(state)))
        print(json.dumps(actions), flush=True)


def checkpoint_steps(path: Path) -> list[int]:
    """The learner steps of the finished checkpoints in `path`, newest first (orbax writes each to a
    temporary directory and renames it: `checkpoint-N` is whole; `checkpoint--1` is its "latest" copy)."""
    return sorted((int(p.name[len("checkpoint-") :]) for p in path.glob("checkpoint-*") if p.name[len("checkpoint-") :].isdigit()), reverse=True)


# ---------------------------------------------------------------------------- hpcrl's side
def train_hpcrl(args: argparse.Namespace) -> None:
    """hpcrl's AlphaZero for `--minutes` or its train.total_steps; a snapshot every `--snapshot-every` s."""
    import torch

    from hpcrl import games
    from hpcrl.config.load import load_experiment
    from hpcrl.rl.alphazero import AlphaZero
    from hpcrl.rl.train import seed_everything, setup_torch

    exp = load_experiment(CONFIGS[args.game], [f"sweep.seeds=[{args.seed}]", *args.set])
    device = setup_torch(exp.train.torch_threads, "cpu")  # as `hpcrl train` sets it: 1 thread unless the config says otherwise
    seed_everything(args.seed)
    agent = AlphaZero(exp.train, games.load(exp.env), device, args.seed)  # type: ignore[arg-type]
    args.path.mkdir(parents=True, exist_ok=True)
    start, last, cpu = time.monotonic(), 0.0, time.process_time()
    while (elapsed := time.monotonic() - start) < args.minutes * 60 and agent.global_step < exp.train.total_steps:
        agent.train_iteration()
        elapsed = time.monotonic() - start
        if elapsed - last >= args.snapshot_every:
            torch.save(agent.policy.state_dict(), args.path / f"snapshot-{elapsed:.1f}.pt")
            last = elapsed
    torch.save(agent.policy.state_dict(), args.path / f"snapshot-{elapsed:.1f}.pt")
    (args.path / "trained.json").write_text(json.dumps({"seconds": elapsed, "positions": agent.global_step, "updates": agent.version, "cpu_s": time.process_time() - cpu}))


# ---------------------------------------------------------------------------- the run (hpcrl's environment)
def run_bounded(command: list[str], seconds: float, log: Path, env: dict[str, str] | None = None, begun: Path | None = None) -> tuple[int | None, float]:
    """`command` in its own session, output to `log`, for `seconds` from when `begun` exists (its
    training started: imports and start-up are not counted, as they are not on hpcrl's side; at most
    START_S for them): its exit code (None if it was stopped) and the CPU seconds its processes used
    in those `seconds`."""
    from _cpu import tree_cpu_seconds

    from hpcrl.runtime.lifeline import dies_with_me

    with open(log, "w") as out:
        # In a session of its own (killed as a group below), and killed by the kernel if this process is (a pool worker with --at-once).
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, preexec_fn=dies_with_me())
        try:
            start = time.monotonic()
            while begun is not None and not begun.exists() and child.poll() is None and time.monotonic() - start < START_S:
                time.sleep(0.2)
            cpu = tree_cpu_seconds(child.pid)[1]
            try:
                return child.wait(timeout=seconds), 0.0
            except subprocess.TimeoutExpired:
                return None, tree_cpu_seconds(child.pid)[1] - cpu
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()


class RemoteAgent:
    """hpcrl.rl.strength's Agent, played by OpenSpiel's bot in its venv (`serve`), one process per side."""

    def __init__(self, python: Path, path: Path, simulations: int, seed: int) -> None:
        self.proc = subprocess.Popen([str(python), __file__, "--serve", str(path), "--simulations", str(simulations), "--seed", str(seed), "--path", str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        if (self.proc.stdout.readline() if self.proc.stdout else "").strip() != "ready":
            raise RuntimeError(f"OpenSpiel's agent for {path} did not start")

    def _ask(self, request: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"OpenSpiel's agent ended (exit {self.proc.wait()})")
        return json.loads(answer)

    def load(self, step: int) -> None:
        self._ask({"load": step})

    def __call__(self, states: list[Any]) -> list[int]:
        return self._ask([list(s.state.history()) for s in states])

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def harness(spec: Any, agent: Any, opponents: list[str], n_games: int, seed: int) -> dict[str, dict[str, int]]:
    """The same games for every side: each opponent, `n_games`, the agent first in the even ones."""
    from hpcrl.rl.strength import make_opponent, play_match

    out = {}
    for i, name in enumerate(opponents):
        results = play_match(spec, agent, make_opponent(name, spec, seed + i), n_games, 1000)
        out[name] = {k: int(sum(m[k] for *_, m in results)) for k in ("win", "draw", "loss")}
    return out


def hpcrl_agent(args: argparse.Namespace, snapshot: Path) -> tuple[Any, Any]:
    import torch

    from hpcrl import games
    from hpcrl.config.load import load_experiment
    from hpcrl.rl.alphazero import make_network
    from hpcrl.rl.strength import mcts_agent

    exp = load_experiment(CONFIGS[args.game], [f"sweep.seeds=[{args.seed}]", *args.set])
    spec = games.load(exp.env)
    net = make_network(exp.train, spec)  # type: ignore[arg-type]
    net.load_state_dict(torch.load(snapshot, weights_only=True))
    net.eval()
    return spec, mcts_agent(net, torch.device("cpu"), spec, args.simulations, exp.train.c_puct)  # type: ignore[attr-defined]


def openspiel_spec(game: str) -> Any:
    from hpcrl import games
    from hpcrl.config.load import load_experiment

    return games.load(load_experiment(CONFIGS[game], ["env.backend=openspiel", f"env.id={game}", "env.kwargs={}"]).env)


def snapshots(side: str, path: Path) -> list[tuple[float, Any]]:
    """(training seconds, snapshot) of a side's run, oldest first: hpcrl's files, OpenSpiel's checkpoints by their time."""
    if side == "hpcrl":
        return sorted((float(p.stem.split("-", 1)[1]), p) for p in path.glob("snapshot-*.pt"))
    if not (path / "checkpoint-0").exists():
        return []
    begun = (path / "checkpoint-0").stat().st_mtime  # its first network, saved as its learner starts: hpcrl's clock starts there too
    return sorted((max(0.0, (path / f"checkpoint-{s}").stat().st_mtime - begun), s) for s in checkpoint_steps(path))


def side_result(args: argparse.Namespace, side: str, python: Path | None) -> dict[str, Any]:
    path = args.path / side
    snaps = snapshots(side, path)
    if not snaps:
        return {"side": side, "error": f"no snapshot in {path}"}
    remote = RemoteAgent(python, path, args.simulations, args.seed) if side != "hpcrl" else None  # type: ignore[arg-type]
    spec = openspiel_spec(args.game) if remote else None

    def play(snap: Any, opponents: list[str]) -> dict[str, dict[str, int]]:
        if remote is None:
            s, agent = hpcrl_agent(args, snap)
            return harness(s, agent, opponents, args.games, 1_000_003 + args.seed)
        remote.load(snap)
        return harness(spec, remote, opponents, args.games, 1_000_003 + args.seed)

    try:
        result: dict[str, Any] = {"side": side, "snapshot_s": snaps[-1][0], "final": play(snaps[-1][1], args.opponents)}
        if remote is None:
            result.update(json.loads((path / "trained.json").read_text()))
        else:
            result["seconds"] = args.minutes * 60 if args.minutes else snaps[-1][0]
            result["cpu_s"] = json.loads((path / "trained.json").read_text())["cpu_s"] if (path / "trained.json").exists() else 0.0
            result["learner_steps"] = snaps[-1][1]
            log = (path / "log-learner.txt").read_text() if (path / "log-learner.txt").exists() else ""
            result["states"] = max([int(x.split()[-1]) for x in log.splitlines() if "States seen:" in x] or [0])
            result["games"] = sum(x.startswith("[") and "] Game " in x for p in path.glob("log-actor-*.txt") for x in p.read_text().splitlines())
        if args.game == "tic_tac_toe" and args.curve:
            k = min(args.curve, len(snaps))
            picks = [snaps[round(i * (len(snaps) - 1) / max(1, k - 1))] for i in range(k)]
            result["curve"] = []
            for seconds, snap in dict.fromkeys(picks):
                losses = play(snap, ["perfect"])["perfect"]["loss"]
                result["curve"].append([round(seconds), losses])
                print(f"  {side}: {losses} losses to perfect play at {seconds:.0f} s", flush=True)
                if losses == 0:
                    break
        return result
    finally:
        if remote is not None:
            remote.close()


def train_side(args: argparse.Namespace, side: str, python: Path | None, cpus: list[int]) -> str:
    """Train one side for --minutes on `cpus`; a line saying what it did."""
    path = args.path / side
    shutil.rmtree(path, ignore_errors=True)  # an earlier run's snapshots and start marker
    path.mkdir(parents=True)
    affinity = ["taskset", "-c", ",".join(map(str, cpus))]
    seconds = args.minutes * 60
    if side == "hpcrl":
        command = [*affinity, sys.executable, __file__, "--train-hpcrl", "--game", args.game, "--minutes", str(args.minutes), "--path", str(path),
                   "--seed", str(args.seed), "--snapshot-every", str(args.snapshot_every), "--set", *args.set]  # fmt: skip
        code, _ = run_bounded(command, seconds + 600, path / "stdout.txt")  # it stops itself after its iteration
        return f"hpcrl: exit {code}" if code else "hpcrl: trained"
    env = {**os.environ, JIT: "1" if side == "openspiel-jitted" else "0", "JAX_PLATFORMS": "cpu"}
    if side == "openspiel-jitted":
        check = subprocess.run([*affinity, str(python), __file__, "--check-jit", "--game", args.game, "--path", str(path)], capture_output=True, text=True, env=env, timeout=START_S)
        print(f"{side}: " + (check.stdout.strip().splitlines() or [f"--check-jit exited {check.returncode}: {check.stderr.strip()[-300:]}"])[-1], flush=True)
    command = [*affinity, str(python), __file__, "--train-openspiel", "--game", args.game, "--path", str(path)]
    code, cpu = run_bounded(command, seconds, path / "stdout.txt", env, path / "checkpoint-0")
    (path / "trained.json").write_text(json.dumps({"cpu_s": cpu}))
    if code is not None:
        return f"{side}: ended early (exit {code}): see {path / 'stdout.txt'}"
    return f"{side}: trained {args.minutes:g} min, {max(checkpoint_steps(path), default=0)} learner steps"


def run_side(args: argparse.Namespace, side: str, python: Path | None, cpus: list[int]) -> dict[str, Any]:
    """Train one side on `cpus` (unless --minutes is 0), then play its final network: its row. The
    harness runs on the same cores, so sides run at once (--at-once) do not take each other's. A
    SIGTERM (the pool ending this worker when another died) unwinds through run_bounded's cleanup, so a
    side's training, in a session of its own, does not outlive it."""
    os.sched_setaffinity(0, cpus)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.minutes > 0:
            print(train_side(args, side, python, cpus), f"(load average {os.getloadavg()[0]:.2f})", flush=True)
        return side_result(args, side, python)
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - one side's failure is its row; the others go on
        return {"side": side, "error": f"{type(exc).__name__}: {exc}"[:300]}


def core_shares(cpus: list[int], sides: int, at_once: bool) -> list[list[int]]:
    """The cores of each side: all of them in turn, or with --at-once disjoint shares, as even as they divide."""
    return [cpus[i::sides] for i in range(sides)] if at_once else [cpus] * sides


def _outcome(side: str, future: Future) -> dict[str, Any]:
    """A side's row from its pool worker; a worker that died (killed, out of memory) is that side's FAILED row."""
    try:
        return future.result()
    except BrokenProcessPool as exc:
        return {"side": side, "error": f"its worker process died: {exc}"[:300]}


def table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    head = f"{'side':<19}{'trained':>9}{'CPU':>7}{'work':>36}  " + "  ".join(f"{o:>18}" for o in args.opponents)
    lines = [head + ("  first 0 losses" if args.game == "tic_tac_toe" else "")]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['side']:<19}{'-':>9}{'':>43}  {r['error'] if r['error'].startswith('SKIPPED') else 'FAILED: ' + r['error']}")
            continue
        work = f"{r['positions']} positions, {r['updates']} updates" if r["side"] == "hpcrl" else f"{r['games']} games, {r['learner_steps']} learner steps"
        cells = "  ".join(f"{'{win}W {draw}D {loss}L'.format(**r['final'][o]):>18}" for o in args.opponents)
        first = ""
        if args.game == "tic_tac_toe":
            zero = [s for s, losses in r.get("curve", []) if losses == 0]
            first = f"  {zero[0]} s" if zero else "  not reached"
        lines.append(f"{r['side']:<19}{r['seconds']:>8.0f}s{r.get('cpu_s', 0):>6.0f}s{work:>36}  {cells}{first}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(CONFIGS), default="connect_four")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--minutes", type=_args.minutes, default=20, help="training wall time of each side; 0: play what is already in --path")
    parser.add_argument("--cpus", type=_args.cpu, nargs="+", help="the cores each side trains on (default: all this process may use)")
    parser.add_argument("--at-once", action="store_true", help="train and then play the sides at the same time, each on its own share of --cpus")
    parser.add_argument("--games", type=_args.positive_integer, default=40, help="per opponent, each colour half")
    parser.add_argument("--simulations", type=_args.positive_integer, default=200, help="per move of each side's agent in the harness")
    parser.add_argument("--opponents", nargs="+", help="hpcrl.rl.strength opponents (default: perfect for tic-tac-toe, mcts:100 mcts:1000 for connect four)")
    parser.add_argument("--curve", type=_args.count, default=4, help="tic-tac-toe: snapshots played against perfect play, evenly spaced, until one loses none")
    parser.add_argument("--snapshot-every", type=_args.seconds, default=15.0, help="hpcrl's side: seconds of training between snapshots")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="hpcrl's config overrides")
    parser.add_argument("--path", type=Path, required=True)
    parser.add_argument("--seed", type=_args.seed, default=0)
    parser.add_argument("--train-hpcrl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--train-openspiel", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--check-jit", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_hpcrl:
        return train_hpcrl(args)
    if args.train_openspiel:
        return train_openspiel(args)
    if args.check_jit:
        jit_inference()
        return print(check_jit(args.game))
    if args.serve:
        return serve(args.serve, args.simulations, args.seed)
    from _venvs import Unavailable, venv_python

    _args.experiment(parser, CONFIGS[args.game], [f"sweep.seeds=[{args.seed}]", *args.set])  # hpcrl's side's: before any folder or venv is made
    args.opponents = args.opponents or OPPONENTS[args.game]
    cpus = args.cpus or sorted(os.sched_getaffinity(0))
    if len(set(args.sides)) < len(args.sides):
        parser.error(f"argument --sides: each side once (they would train into the same folder), got {' '.join(args.sides)}")
    if len(set(cpus)) < len(cpus):
        parser.error(f"argument --cpus: each core once (--at-once would put two sides on one), got {' '.join(map(str, cpus))}")
    args.path.mkdir(parents=True, exist_ok=True)
    lock = open(args.path / ".lock", "w")  # held until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        parser.error(f"argument --path: another run of this benchmark is using {args.path} (each run empties its sides' folders)")
    if args.at_once and len(cpus) < len(args.sides):
        parser.error(f"--at-once gives each side a core of its own: {len(args.sides)} sides need {len(args.sides)} of --cpus, not {len(cpus)}")
    print(f"{args.game}: {args.minutes:g} min a side on CPUs {cpus}{' split between the sides, all at once' if args.at_once else ''}, {args.games} games per opponent, {args.simulations} simulations a move; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)  # fmt: skip
    python, skipped = None, {}
    if any(side != "hpcrl" for side in args.sides):
        try:
            python = venv_python("openspiel", REQUIREMENTS)
        except Unavailable as exc:
            print(f"OpenSpiel's sides: SKIPPED: {exc}", flush=True)
            skipped = {side: f"SKIPPED: {exc}" for side in args.sides if side != "hpcrl"}
    sides = [side for side in args.sides if side not in skipped]
    shares = core_shares(cpus, len(sides), args.at_once)
    if args.at_once and sides:
        from hpcrl.runtime.lifeline import die_with_parent

        # Forked (nothing threaded is running yet); each worker dies with this process, kill -9 included, and its
        # side's training with it (run_bounded), so no side trains on for an hour after the benchmark is gone.
        with ProcessPoolExecutor(len(sides), mp_context=multiprocessing.get_context("fork"), initializer=die_with_parent) as pool:
            futures = {side: pool.submit(run_side, args, side, python, share) for side, share in zip(sides, shares)}
            done = {side: _outcome(side, future) for side, future in futures.items()}
    else:
        done = {side: run_side(args, side, python, share) for side, share in zip(sides, shares)}
    rows = [{"side": side, "error": skipped[side]} if side in skipped else done[side] for side in args.sides]
    print()
    print(table(args, rows))
    tmp = args.path / "results.json.tmp"
    tmp.write_text(json.dumps({"game": args.game, "minutes": args.minutes, "cpus": cpus, "at_once": args.at_once, "games": args.games, "simulations": args.simulations, "rows": rows}, indent=1))
    os.replace(tmp, args.path / "results.json")


if __name__ == "__main__":
    main()
