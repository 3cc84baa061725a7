"""The optimiser step of every algorithm, over one flat parameter buffer.

For the small networks of classic control (a 64-64 actor-critic is 12 tensors, 4.6k numbers)
an optimiser step on a CPU is almost all per-call overhead. Measured inside a PPO update on
CartPole (2-CPU Xeon, torch 2.13), where each step follows a backward pass with cold caches:
`nn.utils.clip_grad_norm_` over the 12 tensors took 121 us and fused `torch.optim.Adam` 114-136 us,
beside 650 us for the forward and backward passes. So:

- `flatten_parameters` makes every parameter a view into one buffer and every `.grad` a view
  into one gradient buffer: backward accumulates into it, and zeroing and clipping are a few
  ops on one tensor (clip: 43 us);
- `Adam` and `RMSprop` update that one tensor with torch's own arithmetic (Adam through the
  fused kernel torch.optim.Adam(fused=True) uses, RMSprop with the ops of torch.optim.RMSprop)
  without torch.optim's per-call machinery (Adam: 27 us). They keep `param_groups`, so a
  learning-rate schedule and CUDA's GradScaler work as with torch's; the options our configs
  never set (weight decay, momentum, amsgrad, centred RMSprop) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def flatten_parameters(params: list[nn.Parameter]) -> nn.Parameter:
    """One Parameter whose storage backs all of `params`, and whose gradient backs all of theirs.

    The module keeps its own Parameters, so state_dict, loading and evaluation are unchanged;
    it must not be moved to another device afterwards, which would copy them out of the buffer.
    """
    if len({(p.dtype, p.device) for p in params}) != 1:
        raise ValueError("flatten_parameters needs parameters of one dtype on one device")
    with torch.no_grad():
        flat = nn.Parameter(torch.cat([_in_memory_order(p.detach()).reshape(-1) for p in params]))
    flat.grad = torch.zeros_like(flat)
    _view_into(params, flat)
    return flat


def _view_into(params: list[nn.Parameter], flat: nn.Parameter) -> None:
    """Make each of `params` and its gradient a view of its stretch of `flat` and `flat.grad`."""
    offset = 0
    for p in params:
        n = p.numel()
        p.data = _view_like(flat.data[offset : offset + n], p)
        p.grad = _view_like(flat.grad[offset : offset + n], p)
        offset += n


def _channels_last(p: torch.Tensor) -> bool:
    """Whether `p` is a channels-last convolution weight. The channel stride decides: with one input
    channel (grey frames, depth) both layouts are contiguous, and a view of NCHW strides made oneDNN
    compute the first convolution in NCHW against the second's NHWC weights, each training step
    reordering its output and gradient between the two. With the strides kept, on a 2-core Xeon
    with AMX (2026-12-06, alternated in one process): PPO's update on configs/vizdoom_ppo.yaml 134
    ms of CPU against 164 under bf16 autocast, 148 against 182 in float32, the same numbers to the
    bit; the rollout's acting pass of 8 frames 0.56 against 0.63 ms."""
    return p.dim() == 4 and p.stride(1) == 1 and p.is_contiguous(memory_format=torch.channels_last)


def _in_memory_order(p: torch.Tensor) -> torch.Tensor:
    """`p` with its dimensions in the order its numbers lie in memory (NHWC for a channels-last weight)."""
    return p.permute(0, 2, 3, 1) if _channels_last(p) else p


def _view_like(chunk: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A view of a flat chunk shaped and strided as `p`: a channels-last convolution weight stays
    channels-last (NatureCNN), so convolutions do not reorder it at every call."""
    if _channels_last(p):
        out, channels, height, width = p.shape
        return chunk.view(out, height, width, channels).permute(0, 3, 1, 2)
    return chunk.view_as(p)


class FlatOptimizer:
    """An optimiser of one flat buffer, with torch.optim's `param_groups` (so a learning-rate
    schedule and CUDA's GradScaler work as with any optimiser) and none of its per-call machinery:
    inside an update loop on a CPU that machinery costs more than Adam's arithmetic (60 us)."""

    def __init__(self, params: Iterable[nn.Parameter], **hyper: Any) -> None:
        params = list(params)
        if len(params) != 1:
            raise ValueError(f"{type(self).__name__} optimises one flat parameter buffer (see flatten_parameters), got {len(params)} tensors")
        self.param = params[0]
        self.param_groups = [{"params": params, **hyper}]
        self.state = self.initial_state()

    def initial_state(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.state):
            raise ValueError(f"{type(self).__name__} state has {sorted(state)}, expected {sorted(self.state)}")
        for k, v in state.items():  # in place: the state may be shared with a learner process
            self.state[k].copy_(v)


class Adam(FlatOptimizer):
    """Adam (Kingma and Ba 2015), without weight decay or amsgrad, through the fused kernel that
    torch.optim.Adam(fused=True) calls: one op however large the network (for DQN's 256-256 net
    the seven unfused ops took 150 us more per update), and the same arithmetic (see the tests)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps)

    def initial_state(self) -> dict[str, torch.Tensor]:
        p = self.param
        return {"step": torch.zeros((), device=p.device), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    @torch.no_grad()
    def step(self) -> None:
        group, state = self.param_groups[0], self.state
        beta1, beta2 = group["betas"]
        state["step"] += 1
        torch._fused_adam_(
            [self.param], [self.param.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
            lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], amsgrad=False, maximize=False,
        )  # fmt: skip


class RMSprop(FlatOptimizer):
    """RMSprop as torch.optim.RMSprop computes it (eps outside the square root, as SB3's A2C
    uses; TensorFlow puts it inside), without momentum, centring or weight decay."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8) -> None:
        super().__init__(params, lr=lr, alpha=alpha, eps=eps)

    def initial_state(self) -> dict[str, torch.Tensor]:
        return {"square_avg": torch.zeros_like(self.param)}

    @torch.no_grad()
    def step(self) -> None:
        group, square_avg, grad = self.param_groups[0], self.state["square_avg"], self.param.grad
        square_avg.mul_(group["alpha"]).addcmul_(grad, grad, value=1 - group["alpha"])
        self.param.addcdiv_(grad, square_avg.sqrt().add_(group["eps"]), value=-group["lr"])


class GradientStep:
    """One optimiser step over a module's parameters: zero, backward, global-norm clip, step; with
    loss scaling for fp16 autocast on CUDA (bf16 and fp32 need none).

    The parameters are flattened first and `make_optimizer` builds the optimiser over the flat
    buffer. Gradients are zeroed in place, never set to None: the views must stay where they are.
    """

    def __init__(
        self, params: Iterable[nn.Parameter], make_optimizer: Callable[[list[nn.Parameter]], Any], max_grad_norm: float, amp: str, device: torch.device,
        reduce: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.params = list(params)
        self.flat = flatten_parameters(self.params)
        self.reduce = reduce
        """DD-PPO's all-reduce of the flat gradient, right after backward: one collective per step,
        before clipping (so the clip sees the averaged gradient) and before fp16 unscaling (so an
        overflow on any rank makes every rank skip the step)."""
        self.optimizer = make_optimizer([self.flat])
        self.max_grad_norm = max_grad_norm
        self.scaler = torch.amp.GradScaler(device.type) if amp == "fp16" and device.type == "cuda" else None

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def __call__(self, loss: torch.Tensor) -> None:
        self.flat.grad.zero_()
        if self.scaler is None:
            loss.backward()
            if self.reduce is not None:
                self.reduce(self.flat.grad)
            self._clip()
            self.optimizer.step()
            return
        self.scaler.scale(loss).backward()
        if self.reduce is not None:
            self.reduce(self.flat.grad)
        self.scaler.unscale_(self.optimizer)
        self._clip()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    @torch.no_grad()
    def _clip(self) -> None:
        """Scale the gradient to a global norm of at most max_grad_norm (nn.utils.clip_grad_norm_'s rule)."""
        grad = self.flat.grad
        grad.mul_((self.max_grad_norm / (torch.linalg.vector_norm(grad) + 1e-6)).clamp_(max=1.0))

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a replica of this step works on: the flat weights, their gradient, the optimiser's state."""
        return {"weights": self.flat.data, "grad": self.flat.grad, **{f"optimizer.{k}": v for k, v in self.optimizer.state.items()}}

    def bind(self, tensors: dict[str, torch.Tensor]) -> None:
        """Work on `tensors` (as `tensors()` names them; another process's, in shared memory) from
        now on, with the numbers they hold."""
        self.flat.data = tensors["weights"]
        self.flat.grad = tensors["grad"]
        _view_into(self.params, self.flat)
        self.optimizer.state = {k: tensors[f"optimizer.{k}"] for k in self.optimizer.state}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
