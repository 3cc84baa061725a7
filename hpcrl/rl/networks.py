"""Policies for every algorithm: observation encoders, an optional GRU core, actor-critic and Q heads.

Encoders by observation space:
- a flat Box: an MLP;
- an image Box (C, H, W): the Nature CNN (Mnih et al. 2015), then the MLP; uint8 pixels are
  scaled to [0, 1] inside the network, so they cross to the GPU at a quarter of float32's size;
- a Dict (Habitat: depth and/or RGB images beside a pointgoal vector): the CNN over the image
  keys stacked on channels, concatenated with the vector keys, then the MLP.

Initialisation follows CleanRL (orthogonal, sqrt(2) gain in the torso, 0.01 on the policy
head, 1 on the value head), which matters more for PPO's early learning than most
hyperparameters.

Action distributions are written out (log-softmax, Gaussian log-density) instead of being built
as torch.distributions objects: on a CPU, building and checking those objects costs more than a
64-64 MLP's forward pass, and the rollout pays for it at every vector step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Union

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.config.hparams import NATURE_CNN
from hpcrl.rl.first_conv import FirstConv2d, PackedFirstConv, scaled
from hpcrl.rl.packed import PACKS, PackedLayer, packs

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
ACTIVATION_FNS = {"tanh": torch.tanh, "relu": torch.relu}
"""The same functions as ACTIVATIONS' modules, called directly by the encoders' forward pass."""
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def bf16_pays(cpuinfo: str) -> bool:
    """Whether oneDNN's bfloat16 convolutions beat float32 for these networks on the CPU that
    /proc/cpuinfo's text `cpuinfo` describes: with AMX tiles (`amx_bf16`), or with AVX512-BF16 on
    an AMD CPU, which runs its bfloat16 dot products (VDPBF16PS) at twice float32's rate.

    Measured with torch 2.13, PPO's update on configs/vizdoom_ppo.yaml (16 gradient steps of 64 80x60
    frames, one thread): on an AMD EPYC with AVX512-BF16 (Zen 4, 2 cores, 2026-12-04) 115 ms of CPU
    in bfloat16 against 173 in float32, and async PPO on ViZDoom basic ran at 1,801 / 1,686 / 1,748
    env steps/s against 1,503 / 1,561 / 1,685 (alternated, benchmarks/vizdoom_speed.py); on a Zen 5 (2026-12-02) a forward and
    backward of 64 frames was 20-40% cheaper. On the project's 2-core Xeon with AVX512-BF16 and no
    AMX it was slower: 26 ms against 20 ms, and PPO ran at 847 steps/s against 1,034."""
    flags: set[str] = set()
    vendor = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "vendor_id" and not vendor:
            vendor = value.strip()
    return "amx_bf16" in flags or ("avx512_bf16" in flags and vendor == "AuthenticAMD")


def _cpu_bf16_pays() -> bool:
    """`bf16_pays` for this machine's CPU (False where /proc/cpuinfo cannot be read). Every process
    that imports this module asks, so only the first processor's block is read: the whole file is a
    block per core (about 7,000 lines on a 256-core node)."""
    try:
        with open("/proc/cpuinfo") as f:
            return bf16_pays("".join(itertools.takewhile(str.strip, f)))
    except OSError:
        return False


CPU_BF16 = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported() and _cpu_bf16_pays())
"""Whether `amp: bf16` runs the encoder in bfloat16 on this CPU: where oneDNN supports it and it is
faster than float32 (`bf16_pays`: AMX, or AVX512-BF16 on AMD). The rollout's small forward passes
gain little (8 frames: 0.58 ms of CPU either way on the Zen 4); the update most. Elsewhere bf16 is
ignored on a CPU, bit for bit."""

def cpu_precision(amp: str) -> str | None:
    """What `train.amp` does on this CPU, for the run's log (None for `none`): whether bfloat16 runs
    depends on the node's CPU (`bf16_pays`), so two runs of one setting on different nodes, or a run
    requeued onto another kind of node, may differ in their arithmetic, and the log says which."""
    if amp == "none":
        return None
    if amp == "bf16" and CPU_BF16:
        return "train.amp bf16: the encoder runs in bfloat16 on this CPU"
    where = "CUDA only" if amp == "fp16" else "CUDA, and CPUs with AMX or AMD CPUs with AVX512-BF16"
    return f"train.amp {amp} is ignored on this CPU, which runs float32 ({amp} runs on {where})"


Obs = Union[torch.Tensor, dict[str, torch.Tensor]]
"""A batch of observations on the device: one tensor, or one per key of a Dict space."""


def obs_to_tensor(obs: np.ndarray | dict[str, np.ndarray], device: torch.device) -> Obs:
    """The env's arrays as tensors of the same dtype (the network converts; see the module doc)."""
    if isinstance(obs, dict):
        return {k: torch.as_tensor(v, device=device) for k, v in obs.items()}
    return torch.as_tensor(obs, device=device)


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: list[int], activation: str, orthogonal: bool = True) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for size in hidden:
        linear = nn.Linear(in_dim, size)
        layers += [layer_init(linear) if orthogonal else linear, ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


def is_image(space: gym.Space) -> bool:
    """Channel-first images, as the env adapters and frame stacking produce them."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


class NatureCNN(nn.Module):
    """The DQN paper's convolutional torso; the flattened size is probed, so any resolution works
    (ViZDoom's 160x120 or a downsampled 80x60, Habitat's 256x256, Atari's 84x84). `filters` sets
    the three convolutions' widths (`train.cnn_channels`; the paper's 32, 64, 64 by default). Its
    inputs are multiplied by `input_scale` first (1/255 for bytes), inside its first convolution
    (hpcrl.rl.first_conv: bytes are exact in bfloat16, where that layer can use them as they are)."""

    MIN_SIZE = 36
    """Smallest side the three convolutions (8/4, 4/2, 3/1) accept."""

    def __init__(self, channels: int, height: int, width: int, orthogonal: bool = True, filters: Sequence[int] = NATURE_CNN, input_scale: float = 1.0) -> None:
        super().__init__()
        c1, c2, c3 = filters
        if min(height, width) < self.MIN_SIZE:
            raise ValueError(f"image observations of {width}x{height} are too small for the Nature CNN (at least {self.MIN_SIZE}x{self.MIN_SIZE}; lower env.kwargs.downsample)")
        init = layer_init if orthogonal else (lambda layer: layer)
        self.net = nn.Sequential(
            init(FirstConv2d(channels, c1, 8, stride=4, input_scale=input_scale)), nn.ReLU(),
            init(nn.Conv2d(c1, c2, 4, stride=2)), nn.ReLU(),
            init(nn.Conv2d(c2, c3, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        # Channels-last (NHWC) weights: oneDNN's and cuDNN's convolutions work in that layout, and
        # with NCHW weights they reorder every call (a forward and backward of 64 80x60 frames on a
        # 2-core Xeon: 16.8 ms against 19.9). flatten_parameters keeps the layout.
        self.net.to(memory_format=torch.channels_last)
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, channels, height, width)).shape[1])
        self.packed: list[PackedLayer] | None = None
        """In a CPU acting copy (`cast_for_acting`), each convolution and the ReLU after it, packed for oneDNN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        if self.packed is None or torch.is_grad_enabled():
            return self.net(x)
        for layer in self.packed:
            x = layer(x)
        return x.flatten(1)


class Encoder(nn.Module):
    """Observation -> feature vector for every supported observation space (see the module doc).

    With `amp` set and the input on CUDA, the encoder runs under autocast and returns float32,
    so the heads, GRU and losses never see reduced precision. `orthogonal=False` keeps PyTorch's
    default initialisation (see QNetwork). `cnn_channels`: the CNN's filters, for image observations.
    """

    def __init__(
        self, space: gym.Space, hidden: list[int], activation: str, amp: str = "none", orthogonal: bool = True, cnn_channels: Sequence[int] = NATURE_CNN
    ) -> None:
        super().__init__()
        spaces = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {None: space}
        for key, sub in spaces.items():
            if not isinstance(sub, gym.spaces.Box):
                raise ValueError(f"observation {key or ''} of type {type(sub).__name__} is not supported (Box or Dict of Box)")
        self.image_keys = [k for k, s in spaces.items() if is_image(s)]
        self.vector_keys = [k for k, s in spaces.items() if not is_image(s)]
        # Pixels stored as bytes are scaled to [0, 1]; float images (Habitat depth) already are. One image
        # goes to the CNN as stored, which scales it itself (NatureCNN's input_scale); several are scaled
        # here and stacked on channels.
        self.pixel_scale = {k: 1 / 255 if spaces[k].dtype == np.uint8 else 1.0 for k in self.image_keys}
        in_dim = 0
        self.cnn = None
        if self.image_keys:
            sizes = {spaces[k].shape[1:] for k in self.image_keys}
            if len(sizes) > 1:
                raise ValueError(f"image observations must share one resolution, got {sorted(sizes)}")
            height, width = sizes.pop()
            input_scale = self.pixel_scale[self.image_keys[0]] if len(self.image_keys) == 1 else 1.0
            self.cnn = NatureCNN(sum(spaces[k].shape[0] for k in self.image_keys), height, width, orthogonal, cnn_channels, input_scale)
            in_dim += self.cnn.out_dim
        in_dim += sum(int(np.prod(spaces[k].shape)) for k in self.vector_keys)
        self.mlp, self.out_dim = mlp(in_dim, hidden, activation, orthogonal)
        # The MLP is run as plain F.linear / activation calls (the same ops as self.mlp(x)): on a
        # CPU, nn.Module's call machinery costs about as much as a 64-wide layer.
        self._linears = [m for m in self.mlp if isinstance(m, nn.Linear)]
        self._act = ACTIVATION_FNS[activation]
        self.packed_mlp: list[PackedLayer] | None = None
        """In a CPU acting copy (`cast_for_acting`) whose MLP runs in bfloat16, each of its layers and the activation, packed for oneDNN."""
        self.amp_dtype = AMP_DTYPES.get(amp)

    @staticmethod
    def _get(obs: Obs, key: str | None) -> torch.Tensor:
        return obs if key is None else obs[key]

    def autocasts(self, device: str) -> bool:
        """Whether the forward pass runs under autocast on this device type (`cuda`, `cpu`)."""
        return self.amp_dtype is not None and (device == "cuda" or (device == "cpu" and self.amp_dtype == torch.bfloat16 and CPU_BF16))

    def forward(self, obs: Obs) -> torch.Tensor:
        device = self._get(obs, (self.image_keys or self.vector_keys)[0]).device.type
        if self.autocasts(device):
            # No cast cache: each weight is cast once per forward anyway, and a cache kept
            # across a CUDA graph capture would replay a stale cast (rl/graphs.py).
            with torch.autocast(device, dtype=self.amp_dtype, cache_enabled=False):
                return self._encode(obs).float()
        return self._encode(obs)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_mlp is not None and not torch.is_grad_enabled():
            for layer in self.packed_mlp:
                x = layer(x)
            return x
        act = self._act
        for linear in self._linears:
            x = act(F.linear(x, linear.weight, linear.bias))
        return x

    def _encode(self, obs: Obs) -> torch.Tensor:
        if self.cnn is None and self.vector_keys == [None]:  # the common flat case, without the bookkeeping
            return self._mlp(obs.flatten(1).float())
        parts = []
        if self.cnn is not None:
            if len(self.image_keys) == 1:
                parts.append(self.cnn(self._get(obs, self.image_keys[0])))
            else:
                parts.append(self.cnn(torch.cat([scaled(self._get(obs, k), self.pixel_scale[k]) for k in self.image_keys], dim=1)))
        parts += [self._get(obs, k).flatten(1).float() for k in self.vector_keys]
        return self._mlp(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))


def cast_for_acting(policy: nn.Module, device: torch.device) -> nn.Module:
    """`policy` (a copy that only acts: no gradients, weights copied in with `copy_`) with its
    encoders' weights stored in their autocast dtype, where their forward pass autocasts on
    `device` (but the first convolution's where it runs space-to-depth, `FirstConv2d.space_to_depth_on_cpu`:
    its bfloat16 weights are derived from float32 ones). The same numbers: autocast casts those weights at every forward pass, rounding as
    the copy does; cast once per weight copy instead, a rollout step of 8 80x60 frames on a 2-core
    Xeon with AMX took 0.42 ms of CPU against 0.58 (0.48 in float32). CPU only: on CUDA those casts
    are kernels inside the rollout's CUDA graph (graphs.py), cheap and not measured.

    On a CPU the encoders with a CNN then keep their layers packed for oneDNN (hpcrl.rl.packed: the
    same numbers; the encoder of configs/vizdoom_ppo.yaml over 8 frames 0.52 ms of CPU against 0.81).
    An MLP alone is left as it is: its small layers gain nothing packed (64 x 4: 31 us against 17).
    Returns `policy`."""
    if device.type != "cpu":
        return policy
    for module in policy.modules():
        if isinstance(module, Encoder) and module.autocasts("cpu"):
            kept = {id(p) for m in module.modules() if isinstance(m, FirstConv2d) and m.space_to_depth_on_cpu for p in m.parameters()}
            for param in module.parameters():
                if id(param) not in kept:  # a first convolution that runs space-to-depth derives its bfloat16 weights from float32 ones
                    param.data = param.data.to(module.amp_dtype)
        if isinstance(module, Encoder) and module.cnn is not None and PACKS:
            convs = [layer for layer in module.cnn.net if isinstance(layer, nn.Conv2d)]  # each followed by a ReLU
            if all(packs(conv) for conv in convs):
                first = convs[0]
                assert isinstance(first, FirstConv2d)
                s2d = first.space_to_depth_on_cpu and module.autocasts("cpu")
                module.cnn.packed = [PackedFirstConv(first, torch.relu, s2d)] + [PackedLayer(conv, torch.relu) for conv in convs[1:]]
            if module._linears and all(packs(linear) for linear in module._linears):  # in bfloat16: all of them or none
                module.packed_mlp = [PackedLayer(linear, module._act) for linear in module._linears]
    return policy


class RunningNorm(nn.Module):
    """Running mean and variance of vector observations (Chan et al.'s parallel update, as in
    gymnasium's NormalizeObservation), kept as buffers so they are saved with the policy."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip

    @torch.no_grad()
    def update(self, x: torch.Tensor, moments: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, int]] | None = None) -> None:
        """Fold a batch in; `moments` (the ranks' `Ranks.moments`) pools the batch of every rank."""
        x = x.reshape(-1, *self.mean.shape).double()
        batch_mean, batch_var, n = moments(x) if moments is not None else (x.mean(0), x.var(0, unbiased=False), x.shape[0])
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.float(), (self.var + 1e-8).sqrt().float()
        return ((x.float() - mean) / std).clamp(-self.clip, self.clip)


class CategoricalHead(nn.Module):
    """Discrete actions. Its parameters are log-probabilities (log-softmax of the logits)."""

    def __init__(self, in_dim: int, n: int) -> None:
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, n), std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(F.linear(x, self.linear.weight, self.linear.bias), dim=-1)

    def sample(self, logp: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.apply(logp, torch.empty_like(logp).exponential_(generator=generator))

    def draw(self, batch: int, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
        """The noise `sample` draws for `batch` rows, drawn apart (a CUDA graph takes it as an input)."""
        return torch.empty((batch, self.linear.out_features), device=device).exponential_(generator=generator)

    def apply(self, logp: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        # Gumbel-max: argmax(log p - log E), E ~ Exp(1), is a draw from p, at a third of multinomial's cost.
        return (logp - noise.log()).argmax(-1)

    def mode(self, logp: torch.Tensor) -> torch.Tensor:
        return logp.argmax(-1)

    def log_prob(self, logp: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, logp: torch.Tensor) -> torch.Tensor:
        return -(logp.exp() * logp).sum(-1)


class GaussianHead(nn.Module):
    """Box actions: a diagonal Gaussian with a state-independent log-std (CleanRL's continuous PPO).
    Its parameters are (mean, log_std); actions are sampled unbounded and clipped only for the env."""

    def __init__(self, in_dim: int, n: int) -> None:
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, n), std=0.01)
        self.log_std = nn.Parameter(torch.zeros(1, n))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = F.linear(x, self.linear.weight, self.linear.bias)
        return mean, self.log_std.expand_as(mean)

    def sample(self, params: tuple[torch.Tensor, torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
        mean = params[0]
        return self.apply(params, torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device))

    def draw(self, batch: int, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
        """The noise `sample` draws for `batch` rows, drawn apart (a CUDA graph takes it as an input)."""
        return torch.randn((batch, self.linear.out_features), generator=generator, device=device)

    def apply(self, params: tuple[torch.Tensor, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        mean, log_std = params
        return mean + log_std.exp() * noise

    def mode(self, params: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return params[0]

    def log_prob(self, params: tuple[torch.Tensor, torch.Tensor], action: torch.Tensor) -> torch.Tensor:
        mean, log_std = params
        z = (action - mean) * (-log_std).exp()
        return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return (0.5 + 0.5 * math.log(2 * math.pi) + params[1]).sum(-1)


class ActorCritic(nn.Module):
    """Policy and value for PPO and A2C.

    Flat observations without recurrence get separate actor and critic MLPs (CleanRL's and SB3's
    default, which the tuned CartPole settings assume); images and recurrent policies share one
    encoder (and GRU) between both heads, as in CleanRL's Atari and LSTM variants and
    habitat-baselines, because a CNN per head doubles the cost for no gain.

    Recurrent state is passed explicitly during training (`step`, `evaluate`, `value` take the
    state and `first`, 1 where an observation starts an episode and the state must be zeroed).
    Evaluation's stateless `act` keeps its own memory, which `reset_memory` clears for finished
    episodes.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        hidden: list[int],
        activation: str,
        recurrent_size: int = 0,
        normalize_obs: bool = False,
        amp: str = "none",
        cnn_channels: Sequence[int] = NATURE_CNN,
    ) -> None:
        super().__init__()
        if normalize_obs and (not isinstance(obs_space, gym.spaces.Box) or is_image(obs_space)):
            raise ValueError("normalize_obs applies to flat vector observations (pixels are scaled to [0, 1] anyway)")
        self.obs_norm = RunningNorm(obs_space.shape) if normalize_obs else None
        pixels = isinstance(obs_space, gym.spaces.Dict) or is_image(obs_space)
        self.shared = pixels or recurrent_size > 0
        if self.shared:
            self.encoder = Encoder(obs_space, hidden, activation, amp, cnn_channels=cnn_channels)
            feat_dim = self.encoder.out_dim
        else:  # flat observations: no CNN
            self.actor_encoder = Encoder(obs_space, hidden, activation, amp)
            self.critic_encoder = Encoder(obs_space, hidden, activation, amp)
            feat_dim = self.actor_encoder.out_dim
        self.recurrent_size = recurrent_size
        self.gru = nn.GRU(feat_dim, recurrent_size) if recurrent_size else None
        if self.gru is not None:
            for name, param in self.gru.named_parameters():
                if "weight" in name:
                    nn.init.orthogonal_(param)
                else:
                    nn.init.zeros_(param)
            feat_dim = recurrent_size
        self.critic_head = layer_init(nn.Linear(feat_dim, 1), std=1.0)
        if isinstance(action_space, gym.spaces.Discrete):
            self.actor_head: CategoricalHead | GaussianHead = CategoricalHead(feat_dim, int(action_space.n))
            self.action_low = self.action_high = None
        elif isinstance(action_space, gym.spaces.Box):
            self.actor_head = GaussianHead(feat_dim, int(np.prod(action_space.shape)))
            self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32), persistent=False)
            self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32), persistent=False)
        else:
            raise ValueError(f"actions of type {type(action_space).__name__} are not supported (Discrete or Box)")
        self._memory: torch.Tensor | None = None

    # ------------------------------------------------------------ the shared path
    def initial_state(self, batch: int, device: torch.device) -> torch.Tensor | None:
        return torch.zeros(1, batch, self.recurrent_size, device=device) if self.gru is not None else None

    def _features(self, obs: Obs, state: torch.Tensor | None, first: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(actor features, critic features, new state). For a GRU, `obs` is time-major: T x B rows
        for the B sequences whose states are given."""
        obs = self._normalized(obs)
        if not self.shared:
            return self.actor_encoder.forward(obs), self.critic_encoder.forward(obs), state
        x = self.encoder.forward(obs)
        if self.gru is None:
            return x, x, state
        batch = state.shape[1]
        x = x.view(-1, batch, x.shape[-1])
        keep = (1.0 - first.float()).view(-1, batch, 1)
        outputs = []
        for t in range(x.shape[0]):  # step by step: the state is zeroed where an episode starts
            out, state = self.gru(x[t : t + 1], state * keep[t])
            outputs.append(out)
        x = torch.cat(outputs).view(-1, self.recurrent_size)
        return x, x, state

    def step(
        self, obs: Obs, state: torch.Tensor | None = None, first: torch.Tensor | None = None, with_value: bool = True, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Rollout: sampled action, its log-probability, the value, the new recurrent state.
        `with_value=False` skips a separate critic (value None), so that a rollout can value all
        its observations in one batched pass afterwards; a shared encoder's value costs one
        linear layer and is returned anyway. `generator` draws the actions (a background
        rollout's own, so its draws do not depend on how it interleaves with the update's)."""
        params, value, state = self._acting(obs, state, first, with_value)
        action = self.actor_head.sample(params, generator)
        return action, self.actor_head.log_prob(params, action), value, state

    def step_with_noise(self, obs: Obs, noise: torch.Tensor, with_value: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:
        """`step` of a feed-forward policy with the sample's noise given (`actor_head.draw`): the
        same action for the same draws, with no random op inside (what a CUDA graph replays)."""
        params, value, _ = self._acting(obs, None, None, with_value)
        action = self.actor_head.apply(params, noise)
        return action, self.actor_head.log_prob(params, action), value, None

    def _acting(self, obs: Obs, state: torch.Tensor | None, first: torch.Tensor | None, with_value: bool) -> tuple[Any, torch.Tensor | None, torch.Tensor | None]:
        """The action distribution's parameters, the value (None where skipped) and the new state."""
        if with_value or self.shared:
            a, c, state = self._features(obs, state, first)
            return self.actor_head.forward(a), self._value_head(c), state
        return self.actor_head.forward(self.actor_encoder.forward(self._normalized(obs))), None, state

    def evaluate(self, obs: Obs, action: torch.Tensor, state: torch.Tensor | None = None, first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Update: log-probability and entropy of stored actions, and the value."""
        logprob, params, value = self.evaluate_params(obs, action, state, first)
        return logprob, self.actor_head.entropy(params), value

    def evaluate_params(self, obs: Obs, action: torch.Tensor, state: torch.Tensor | None = None, first: torch.Tensor | None = None) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """`evaluate` with the distribution's parameters in place of the entropy, so an update
        whose loss has no entropy term (ent_coef 0) leaves it out of the graph."""
        a, c, _ = self._features(obs, state, first)
        params = self.actor_head.forward(a)
        return self.actor_head.log_prob(params, action), params, self._value_head(c)

    def _normalized(self, obs: Obs) -> Obs:
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def _value_head(self, c: torch.Tensor) -> torch.Tensor:
        return F.linear(c, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def value(self, obs: Obs, state: torch.Tensor | None = None, first: torch.Tensor | None = None) -> torch.Tensor:
        if self.shared:
            _, c, _ = self._features(obs, state, first)
        else:  # skip the actor's MLP
            c = self.critic_encoder.forward(self._normalized(obs))
        return self._value_head(c)

    def clip_action(self, action: torch.Tensor) -> torch.Tensor:
        """What the env receives: Gaussian samples clipped to the Box; discrete actions unchanged."""
        if self.action_low is None:
            return action
        return torch.max(torch.min(action, self.action_high), self.action_low)

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool, generator: torch.Generator | None = None) -> torch.Tensor:
        batch = next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]
        if self.gru is not None and (self._memory is None or self._memory.shape[1] != batch):
            self._memory = self.initial_state(batch, self.critic_head.weight.device)
        first = torch.zeros(batch, device=self.critic_head.weight.device) if self.gru is not None else None
        a, _, self._memory = self._features(obs, self._memory, first)
        params = self.actor_head(a)
        action = self.actor_head.mode(params) if deterministic else self.actor_head.sample(params, generator)
        return self.clip_action(action)

    def reset_memory(self, done: np.ndarray | torch.Tensor) -> None:
        """Forget the recurrent state of envs whose episode just ended (no-op without a GRU)."""
        if self._memory is not None:
            self._memory[:, torch.as_tensor(done, dtype=torch.bool, device=self._memory.device)] = 0.0

    def clear_memory(self) -> None:
        """Start `act` afresh for new episodes: an evaluation during training must not begin with
        the recurrent state the previous one ended with. (Training keeps its state apart.)"""
        self._memory = None


class QNetwork(nn.Module):
    """Q-values for DQN: the same encoders, a linear head per discrete action.

    PyTorch's default initialisation, as in CleanRL's and SB3's DQN: with the orthogonal
    sqrt(2)-gain init that suits the actor-critic, the initial Q-values are larger and the tuned
    CartPole settings learned less reliably across seeds.
    """

    EVAL_EPSILON = 0.05
    """Exploration kept by stochastic evaluation (`deterministic: false`), the DQN paper's convention."""

    def __init__(
        self, obs_space: gym.Space, action_space: gym.Space, hidden: list[int], activation: str, amp: str = "none", cnn_channels: Sequence[int] = NATURE_CNN
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"DQN needs Discrete actions, got {type(action_space).__name__}")
        self.n_actions = int(action_space.n)
        self.encoder = Encoder(obs_space, hidden, activation, amp, orthogonal=False, cnn_channels=cnn_channels)
        self.head = nn.Linear(self.encoder.out_dim, self.n_actions)

    def forward(self, obs: Obs) -> torch.Tensor:
        return F.linear(self.encoder.forward(obs), self.head.weight, self.head.bias)

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool, generator: torch.Generator | None = None) -> torch.Tensor:
        greedy = self(obs).argmax(-1)
        if deterministic:
            return greedy
        explore = torch.rand(greedy.shape, device=greedy.device, generator=generator) < self.EVAL_EPSILON
        return torch.where(explore, torch.randint(self.n_actions, greedy.shape, device=greedy.device, generator=generator, dtype=greedy.dtype), greedy)

    def reset_memory(self, done: Any) -> None:
        """Feed-forward: nothing to forget (the policy interface evaluation relies on)."""

    def clear_memory(self) -> None:
        """Feed-forward: nothing to forget."""
