"""A CPU acting copy's layers with their weights kept in oneDNN's own layout, ReLU fused in.

torch's `conv2d`, and its `linear` in bfloat16, reorder the weights into oneDNN's blocked layout at
every call on a CPU; for the rollout's small batches that reorder, and a separate pass of the ReLU
over the output, cost about as much as the arithmetic. The copy of the policy that only acts
(`hpcrl.rl.networks.cast_for_acting`) gets new weights once per rollout, so it keeps them reordered
(oneDNN's prepacking, as torch.compile's CPU freezing does) and repacks a layer when its weights
change. The numbers are the same, bit for bit (tests/rl/test_networks.py). On a 2-core Xeon with
AMX, configs/vizdoom_ppo.yaml's encoder over 8 80x60 frames took 0.52 ms of CPU against 0.81 (bf16).

Linear layers in float32 are left to torch: oneDNN's float32 matrix product rounds differently from
the MKL one torch calls, and was no faster at these sizes (8 x 768 x 512: 0.16 ms against 0.14).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

PACKS = torch.backends.mkldnn.is_available()
"""Whether this torch has oneDNN (x86 and most ARM builds); elsewhere an acting copy runs as torch does."""


class PackedLayer:
    """`activation(layer(x))` for a Conv2d, or a Linear with bfloat16 weights, on the CPU: computed by
    oneDNN with the weights packed for it and a ReLU fused into the op (any other activation is
    applied after it).

    Packed at the first call, for that call's input shape (other shapes compute the same numbers),
    and again whenever the weight or bias has changed since: their version counters, which every
    in-place write bumps (`copy_`, `load_state_dict`), are compared at each call. A write through
    `.data` bypasses the counters, as it bypasses autograd's checks. Without gradients only: the
    packed ops have no backward pass."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.layer = layer
        self.activation = activation
        self._attr = "relu" if activation is torch.relu else "none"
        self._conv = (list(layer.padding), list(layer.stride), list(layer.dilation), layer.groups) if isinstance(layer, nn.Conv2d) else None
        """A convolution's padding, stride, dilation and groups, as the ops take them; None for a linear layer."""
        self._packed: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._versions: tuple[int, int] = (-1, -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias, conv = self.layer.weight, self.layer.bias, self._conv
        if not torch.backends.mkldnn.enabled or (conv is not None and x.shape[0] == 1 and weight.dtype == torch.float32):
            # torch's own path: oneDNN switched off, or one image through a float32 convolution, which
            # torch computes with its own kernel for some shapes (aten's use_mkldnn), rounding otherwise
            return self.activation(self.layer(x))
        x = self.prepare(x)
        versions = (weight._version, -1 if bias is None else bias._version)
        if self._packed is None or versions != self._versions:
            weight, self._bias = self.weights()
            self._packed, self._versions = self._pack(weight, x.shape), versions
        if x.dtype != self._packed.dtype:  # the check is cheaper than a no-op `to` through the dispatcher (about 3 us a layer)
            x = x.to(self._packed.dtype)
        if conv is not None:
            out = torch.ops.mkldnn._convolution_pointwise(x, self._packed, self._bias, *conv, self._attr, [None], "")
        else:
            out = torch.ops.mkldnn._linear_pointwise(x, self._packed, self._bias, self._attr, [None], "")
        return out if self._attr == "relu" else self.activation(out)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the packed op takes it: as given (a subclass may rearrange it, hpcrl.rl.first_conv)."""
        return x

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight and bias this op computes with: the layer's own (a subclass may derive them,
        hpcrl.rl.first_conv); asked again whenever the layer's change."""
        return self.layer.weight, self.layer.bias

    def _pack(self, weight: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        if self._conv is not None:
            return torch.ops.mkldnn._reorder_convolution_weight(weight, *self._conv, list(shape))
        return torch.ops.mkldnn._reorder_linear_weight(weight, shape[0])

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedLayer:
        """A copy over the copied layer, packed at its first call (oneDNN's tensors do not copy)."""
        twin = copy.copy(self)
        twin.layer = copy.deepcopy(self.layer, memo)
        twin._packed, twin._bias, twin._versions = None, None, (-1, -1)
        return twin


def packs(layer: nn.Module) -> bool:
    """Whether `PackedLayer` computes `layer` (on the CPU) as torch does and faster: a convolution with
    zero padding given in numbers, or a linear layer in bfloat16."""
    if isinstance(layer, nn.Conv2d):
        return layer.padding_mode == "zeros" and not isinstance(layer.padding, str)
    return isinstance(layer, nn.Linear) and layer.weight.dtype == torch.bfloat16
