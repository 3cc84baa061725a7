"""Training hyperparameters, one dataclass per algorithm.

They live apart from the algorithm files so that validating a config (on a login node, before
anything is submitted) never imports torch. Field names follow CleanRL so that its documentation
and the literature read across directly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal, Optional, Union

from hpcrl.config.schema import setting

MAX_WIDTH = 65_536
"""Widest layer (hidden_sizes, recurrent_size): a wider one is a typo that would exhaust memory."""
MAX_CHANNELS = 4096
"""Most filters in one convolution (cnn_channels)."""
NATURE_CNN = (32, 64, 64)
"""The Nature CNN's filters per convolution (Mnih et al. 2015): cnn_channels' default."""
MAX_BUFFER = 100_000_000
"""Largest DQN replay buffer (transitions); it is allocated whole when training starts."""
MAX_MOVES = 100_000
"""Most moves of one two-player game, played by anyone (hpcrl.games): a game longer than this does not end."""


def minibatch_problem(count: int, num_steps: int, num_envs: int, recurrent: bool, ranks: int = 1) -> str | None:
    """Why PPO's `num_minibatches` cannot split a rollout of `num_steps` x `num_envs` (each rank's,
    with DD-PPO) into equal minibatches, or None. The update (`hpcrl.rl.ppo` `minibatches`) cuts a
    count that does not divide into minibatches of another size and a remainder: 3 of a
    256-transition rollout trained on 85, 85, 85 and 1 transitions, 1000 on 256 of one each. A
    recurrent policy's minibatches are whole env sequences, so its count divides the envs."""
    rollout = "each rank's rollout" if ranks > 1 else "the rollout"
    if recurrent:
        whole, unit = num_envs, "env"
        what = f"env.num_envs ({num_envs}): a recurrent policy's minibatches are whole env sequences of {rollout}"
    else:
        whole, unit = num_steps * num_envs, "transition"
        what = f"{rollout} (num_steps x env.num_envs = {num_steps} x {num_envs} = {whole} transitions)"
    if whole % count == 0:
        return None
    size = max(1, whole // count)  # as the update cuts it
    cuts = whole // size
    got = f"{cuts} minibatch{'es' if cuts > 1 else ''} of {size} {unit}{'s' if size > 1 else ''}" + (f" and one of {whole % size}" if whole % size else "")
    divisors = {d for i in range(1, math.isqrt(whole) + 1) if whole % i == 0 for d in (i, whole // i)}
    near = [max(d for d in divisors if d < count), *sorted(d for d in divisors if d > count)[:1]]
    return f"{count} does not divide {what}; the update would take {got}: use a divisor of {whole}, such as {' or '.join(map(str, near))}"


def device_problem(value: str) -> str | None:
    """torch.device strings hpcrl supports; checked here so that `tpu` fails at sweep time, not in a job."""
    if re.fullmatch(r"auto|cpu|cuda|cuda:\d+|mps", value):
        return None
    return f"expected auto, cpu, cuda, cuda:N or mps, got {value!r}"


@dataclass
class TrainConfig:
    """What every algorithm shares: budget, optimiser basics, network, checkpoints, device."""

    total_steps: int = setting(100_000, ge=1)
    """Environment steps (transitions, every env and rank counted) the run learns from; rounded up to whole
    iterations. AlphaZero counts self-play moves."""
    lr: float = setting(2.5e-4, gt=0)
    """Learning rate of the optimiser (Adam; RMSprop for A2C)."""
    anneal_lr: bool = True
    """Lower the learning rate linearly to 0 over total_steps."""
    gamma: float = setting(0.99, ge=0, le=1)
    """Discount factor of future rewards."""
    max_grad_norm: float = setting(0.5, gt=0)
    """Gradients are clipped to this global L2 norm before each optimiser step."""
    hidden_sizes: list[int] = setting(factory=lambda: [64, 64], ge=1, le=MAX_WIDTH, min_items=1)
    """MLP layers for vector observations; for images, the width of the layer after the Nature CNN."""
    cnn_channels: list[int] = setting(factory=lambda: list(NATURE_CNN), ge=1, le=MAX_CHANNELS, min_items=3, max_items=3)
    """For image observations: filters of the CNN's three convolutions (8x8 stride 4, 4x4 stride 2,
    3x3 stride 1); the default is the Nature CNN's. On a CPU the CNN is most of a pixel learner's
    time: configs/vizdoom_ppo.yaml halves it ([16, 32, 32]: about a third of the CNN's cost, final
    scores on `basic` within the issue-26 target)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the MLP layers."""
    reward_scale: float = setting(1.0, gt=0)
    """Rewards are multiplied by this before learning (ViZDoom's +100 kills); logged returns stay raw."""
    checkpoint_every: int = setting(10, ge=1, learned=False)
    """Write a checkpoint every N updates (and always at the end and on a preemption signal)."""
    keep_checkpoints: int = setting(2, ge=1, learned=False)
    """Newest checkpoints kept on disk; older ones are deleted after each save (`best.pt` is never pruned)."""
    device: str = setting("auto", valid=device_problem, learned=False)
    """`auto` takes the GPU when there is one; `cpu`, `cuda`, `cuda:1` force a device."""
    amp: Literal["none", "bf16", "fp16"] = "none"
    """Mixed precision for the observation encoder (the CNN, where the FLOPs are); heads, recurrent
    core and losses stay float32. On CUDA both; `fp16` adds gradient scaling. On a CPU only `bf16`,
    and only where it measured faster than float32: AMX, or AVX512-BF16 on AMD (networks.CPU_BF16;
    an Intel CPU's AVX512-BF16 alone was slower); elsewhere it is ignored, as `fp16` is on any CPU.
    Each start of a CPU run says in its log which it ran."""
    torch_threads: int = setting(1, ge=1, le=1024, learned=False)
    """Intra-op threads for torch; 1 is fastest for small MLPs and keeps array tasks off each other's cores."""

    def sized_weights(self) -> dict[str, int]:
        """The weights a config alone sizes, by the key that sizes them: those between the hidden layers. A floor
        under the network's size (its input and output layers depend on the env's spaces)."""
        sizes = self.hidden_sizes
        return {"train.hidden_sizes": sum(a * b for a, b in zip(sizes, sizes[1:]))}


@dataclass
class OnPolicyConfig(TrainConfig):
    """What PPO and A2C share: the rollout (n-step batches from all envs, GAE) and the policy shape."""

    num_steps: int = setting(128, ge=1)
    """Vector steps per rollout; the batch is num_steps x num_envs transitions (at most
    `hpcrl.config.experiment.MAX_ROLLOUT`)."""
    gae_lambda: float = setting(0.95, ge=0, le=1)
    """λ of generalised advantage estimation (1: Monte Carlo returns, 0: one-step TD)."""
    ent_coef: float = setting(0.01, ge=0)
    """Weight of the entropy bonus in the loss."""
    vf_coef: float = setting(0.5, ge=0)
    """Weight of the value loss in the loss."""
    norm_adv: bool = True
    """Normalise the advantages of each minibatch to mean 0 and standard deviation 1."""
    recurrent_size: int = setting(0, ge=0, le=MAX_WIDTH)
    """Width of a GRU core between encoder and heads; 0 for a feed-forward policy. Recurrent
    minibatches are whole env sequences (truncated BPTT over `num_steps`)."""
    normalize_obs: bool = False
    """Running mean/std normalisation of vector observations, held in the policy (so evaluation
    uses the training statistics). Helps when features have very different scales (MuJoCo);
    pixels are always scaled to [0, 1] instead."""
    async_rollout: Union[Literal["auto"], bool] = "auto"
    """Overlap sampling and learning: the envs collect the next rollout with a copy of the policy
    (the behaviour policy, one update behind) while the update of the last one runs; PPO's ratio is
    taken against the behaviour policy's stored log-probabilities. `false` takes turns (exact
    on-policy, the learner's own policy acts). `auto`: on for envs in worker processes (ViZDoom,
    Habitat, `vectorization: async`), where it is faster; off for in-process envs (CartPole's
    SyncVectorEnv), whose steps hold the interpreter the update needs."""
    cuda_graph: bool = setting(True, learned=False)
    """On CUDA, a feed-forward policy's rollout forward pass is captured once per env group and
    replayed as one CUDA graph: one launch per step instead of a few dozen small kernels, each of
    which costs host time (rl/graphs.py). The same actions for the same draws; `false` runs it eagerly."""

    def sized_weights(self) -> dict[str, int]:
        """The MLP's, and the GRU core's three gates over the last hidden layer and its own state."""
        return {**super().sized_weights(), "train.recurrent_size": 3 * self.recurrent_size * (self.recurrent_size + self.hidden_sizes[-1])}


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO's clipped objective (Schulman et al. 2017); defaults are CleanRL's."""

    num_minibatches: int = setting(4, ge=1)
    """Minibatches each rollout is split into per epoch."""
    update_epochs: int = setting(4, ge=1)
    """Passes over each rollout per update."""
    clip_coef: float = setting(0.2, gt=0)
    """PPO's clipping range ε of the probability ratio."""
    anneal_clip: bool = False
    """Lower clip_coef linearly to 0 over total_steps (as SB3 does with a schedule)."""
    clip_vloss: bool = True
    """Clip the value loss around the old values as the policy loss is clipped (CleanRL's default)."""
    target_kl: Optional[float] = setting(None, gt=0)
    """Stop an update's epochs early once the approximate KL divergence to the behaviour policy passes this; null: never."""


@dataclass
class A2CConfig(OnPolicyConfig):
    """A2C as PPO with one epoch, one minibatch, no clipping and RMSprop (Huang et al. 2022).

    Defaults are Stable-Baselines3's, which RL Zoo's tuned CartPole set keeps except ent_coef 0.
    """

    lr: float = 7e-4
    anneal_lr: bool = False
    num_steps: int = 5
    gae_lambda: float = 1.0
    ent_coef: float = 0.0
    norm_adv: bool = False
    rms_alpha: float = setting(0.99, ge=0, le=1)
    """RMSprop's smoothing constant."""
    rms_eps: float = setting(1e-5, gt=0)
    """RMSprop's ε, added to the denominator."""
    checkpoint_every: int = 500


@dataclass
class DQNConfig(TrainConfig):
    """Step-based counters are in environment steps (transitions), as in SB3 and CleanRL, whatever
    the number of envs; defaults are CleanRL's."""

    lr: float = 2.5e-4
    anneal_lr: bool = False
    buffer_size: int = setting(10_000, ge=1, le=MAX_BUFFER)
    """Transitions the replay buffer holds (allocated whole when training starts)."""
    batch_size: int = setting(128, ge=1)
    """Transitions per gradient step, sampled from the buffer."""
    learning_starts: int = setting(10_000, ge=0)
    """Gradient steps begin after this many environment steps. A run resumed without its buffer
    also waits until the new buffer holds this many (or is full) before it trains again."""
    train_freq: int = setting(10, ge=1)
    """Environment steps between training phases; one iteration = one such phase."""
    gradient_steps: int = setting(1, ge=1)
    """Gradient steps per training phase."""
    target_update_freq: int = setting(500, ge=1)
    """Environment steps between target-network updates (SB3's `target_update_interval`, CleanRL's
    `target_network_frequency`). With train_freq 256 and gradient_steps 128 and a value below 256,
    the target is refreshed between training phases, never inside one, exactly as in SB3."""
    tau: float = setting(1.0, gt=0, le=1)
    """1.0 copies the online network; below 1, Polyak averaging at each target update."""
    start_e: float = setting(1.0, ge=0, le=1)
    """ε of the ε-greedy exploration at the start."""
    end_e: float = setting(0.05, ge=0, le=1)
    """ε after exploration_fraction of total_steps, kept to the end."""
    exploration_fraction: float = setting(0.5, gt=0, le=1)
    """Fraction of total_steps over which epsilon falls linearly from start_e to end_e."""
    n_step: int = setting(1, ge=1)
    """TD targets from n-step returns. Single-process DQN computes them from the buffer when it samples
    (as SB3's `n_steps`); Ape-X actors send them. Either way a return stops at an episode's end."""
    double_dqn: bool = False
    """Pick the next action with the online network, value it with the target (van Hasselt et al. 2016)."""
    loss: Literal["huber", "mse"] = "mse"
    """TD loss: Huber (smooth L1) or mean squared error."""
    hidden_sizes: list[int] = setting(factory=lambda: [120, 84])
    activation: Literal["tanh", "relu"] = "relu"
    max_grad_norm: float = 10.0
    checkpoint_every: int = 1000
    save_replay: bool = setting(True, learned=False)
    """Store the replay buffer in checkpoints so a requeued job continues with the same data. Off
    for large image buffers (a checkpoint then costs buffer_size x 2 observations of disk): a resumed
    run refills learning_starts transitions before it trains again."""

    def check(self) -> list[tuple[str, str]]:
        """Rules that join fields; each field's own bounds are declared on it."""
        if self.batch_size > self.buffer_size:
            return [("batch_size", f"must not exceed buffer_size ({self.buffer_size})")]
        return []



OPPONENT = re.compile(r"random|perfect|mcts:([1-9][0-9]{0,5})")
"""Fixed opponents of AlphaZero's evaluations: uniform random, perfect play (minimax, small games),
MCTS with random rollouts at N simulations (OpenSpiel's bot for OpenSpiel games)."""


def _opponent_problem(value: str) -> str | None:
    if OPPONENT.fullmatch(value):
        return None
    return f"expected random, perfect or mcts:N (N simulations, 1..999999), got {value!r}"


@dataclass
class AlphaZeroConfig(TrainConfig):
    """Self-play with MCTS guided by a policy-value network (hpcrl/rl/alphazero.py). `total_steps`
    counts self-play moves (positions). Defaults suit tic-tac-toe; configs/ has connect four.
    Of the shared settings, gamma, reward_scale, amp and cnn_channels do not apply (a game's outcome is the target)."""

    lr: float = 1e-3
    anneal_lr: bool = False
    max_grad_norm: float = 5.0
    hidden_sizes: list[int] = setting(factory=lambda: [128, 128])
    activation: Literal["tanh", "relu"] = "relu"
    network: Literal["mlp", "resnet"] = "mlp"
    """`mlp` over the flattened observation (hidden_sizes), or `resnet` over board planes (C, H, W)."""
    channels: int = setting(64, ge=1, le=1024)
    """resnet: filters of every convolution."""
    blocks: int = setting(4, ge=1, le=64)
    """resnet: residual blocks."""
    simulations: int = setting(50, ge=1, le=100_000)
    """MCTS simulations per move in self-play (and in evaluations, unless eval_simulations is set)."""
    eval_simulations: Optional[int] = setting(None, ge=1, le=100_000, learned=False)
    """MCTS simulations per move when the agent plays the opponents; null: `simulations`."""
    c_puct: float = setting(1.5, gt=0, le=100)
    """Exploration constant of PUCT: the weight of the network's prior against the search's values."""
    dirichlet_alpha: float = setting(0.5, gt=0, le=100)
    """Concentration of the root noise in self-play (AlphaZero: about 10 / typical legal moves)."""
    dirichlet_fraction: float = setting(0.25, ge=0, le=1)
    """Share of the Dirichlet noise in the root's priors in self-play (AlphaZero: 0.25)."""
    value_target_q: float = setting(0.0, ge=0, le=1)
    """Weight w of the search's value at the root in each position's value target, (1 - w) z + w q
    with z the game's outcome: 0 is AlphaZero's z alone; the search's value is less noisy than one
    game's outcome (which a blunder later in the game decides), at the price of the network's bias."""
    max_moves: int = setting(1000, ge=1, le=MAX_MOVES, learned=False)
    """Moves after which a game that has not ended fails the run in one line naming the game: in
    self-play and in every evaluation game (a game that ends under random play may not under search,
    where one move passes for ever). OpenSpiel's games must fit theirs in (max_game_length)."""
    temperature_moves: int = setting(4, ge=0, le=10_000)
    """Self-play moves of each game sampled in proportion to visit counts; later moves take the most visited."""
    games_per_iteration: int = setting(32, ge=1, le=100_000)
    """Self-play games played in lockstep per iteration (their leaves share each network call)."""
    train_steps_per_iteration: int = setting(50, ge=1, le=1_000_000)
    """Gradient steps after each iteration's self-play games."""
    batch_size: int = setting(128, ge=1, le=65_536)
    """Positions per gradient step, sampled from the replay window."""
    replay_window: int = setting(20_000, ge=1, le=10_000_000)
    """The newest positions kept for training; a checkpoint holds them."""
    weight_decay: float = setting(1e-4, ge=0, le=1)
    """L2 weight decay of the optimiser."""
    mirror: bool = True
    """Train on a random half of each minibatch mirrored left to right, where the game declares its
    mirror image (`mirror_actions`: connect four, tic-tac-toe; hpcrl.games): the data of twice
    the self-play, as AlphaGo Zero's board symmetries; games without one are trained as they are."""
    opponents: list[str] = setting(factory=lambda: ["random", "mcts:100"], valid=_opponent_problem, min_items=1, learned=False)
    """Whom the evaluations play (eval.episodes / eval.periodic_episodes games each, both colours)."""
    ladder_games: int = setting(10, ge=0, le=10_000, learned=False)
    """Games per pair in the eval stage's Elo ladder (a round robin of `random`, the snapshots of the
    evaluations during training and the evaluated checkpoint, each colour half); 0: no ladder."""
    ladder_players: int = setting(8, ge=1, le=64, learned=False)
    """Snapshots of the evaluations during training in the Elo ladder, evenly spaced (the last always
    in), besides `random` and the evaluated checkpoint: p players play p^2 / 2 matches, at
    `simulations` per move. With `eval.episodes` games against each opponent at `eval_simulations`,
    this sizes the eval stage, which `hpcrl eval` prints as it starts."""
    checkpoint_every: int = 5

    def sized_weights(self) -> dict[str, int]:
        """hidden_sizes' (a resnet uses none)."""
        return {} if self.network == "resnet" else super().sized_weights()

    def check(self) -> list[tuple[str, str]]:
        if len(set(self.opponents)) != len(self.opponents):
            return [("opponents", f"expected each opponent once, got {self.opponents}")]
        return []


ALGORITHMS: dict[str, type[TrainConfig]] = {"ppo": PPOConfig, "a2c": A2CConfig, "dqn": DQNConfig, "alphazero": AlphaZeroConfig}
