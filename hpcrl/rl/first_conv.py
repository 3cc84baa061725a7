"""The Nature CNN's first convolution (8x8, stride 4) on a CPU, where oneDNN computes it far below its
speed elsewhere for the frames RL feeds it: one channel (ViZDoom's grey frames, Habitat's depth).

Two rules, each the same convolution computed another way:
- in float32 training, as one matrix product over the input's patches (`patch_conv`), where the
  CPU is below AVX-512 (`FIRST_CONV_AS_GEMM`);
- in bfloat16 (`amp: bf16` on a CPU where hpcrl.rl.networks.CPU_BF16), as a stride-1 convolution of
  the frames rearranged space-to-depth (`space_to_depth`): each 4x4 block of pixels becomes 16
  channels, and the 8x8/4 kernel a 2x2/1 kernel over them. bfloat16's dot products pair input
  channels (AVX512-BF16 two, AMX tiles more), and one channel left them nothing to pair; sixteen
  do. Byte pixels (0-255) are exact in bfloat16, so the encoder hands them over as stored and the
  1/255 goes into the weights (`FirstConv2d.input_scale`).

Measured on the project's 2-core Xeon with AMX (torch 2.13, 2026-12-06): PPO's update on
configs/vizdoom_ppo.yaml (16 gradient steps of 64 80x60 frames) took 88.8 ms of CPU against 94.6 with
this layer in float32 on one thread (alternated in one process; the same on two threads), float32
having been faster than oneDNN's one-channel bfloat16 (1.3-2.3 ms for 64 frames forward and backward
against 2.5-3.9); the layer 0.50 ms a gradient step against 0.84, and over the rollout's 8 frames
0.055 ms against 0.070, rearranging included. Not measured on an AMD CPU with AVX512-BF16, where
`amp: bf16` also runs on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.rl.packed import PackedLayer

PATCH_CONV_MAX = 1 << 26
"""The most elements (256 MB of float32) `patch_conv`'s patch matrix may hold; above, oneDNN's convolution."""

FIRST_CONV_AS_GEMM = torch.backends.cpu.get_cpu_capability() != "AVX512"
"""Whether training a one-channel first convolution in float32 on this CPU goes through `patch_conv`:
where torch's CPU kernels are below AVX-512 (measured on an AVX2 AMD EPYC, where it was several times
faster). With AVX-512 oneDNN's own is the faster: PPO's float32 update on configs/vizdoom_ppo.yaml took
139 ms of CPU against 151 through the GEMM on a 2-core Xeon with AMX (2026-12-05), 153 against 161 on
a Zen 4 EPYC (2026-12-04). Those were measured while the flat parameter buffer handed the first
convolution NCHW weights (hpcrl.rl.optim._channels_last); with its channels-last weights kept, on the
Xeon (2026-12-06): 135 against 175 ms, and 169 against 196 with torch's and oneDNN's kernels held to
AVX2 (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2). The AVX2 EPYC itself was not measured
again, so the rule stands where it was measured."""

_VIEWS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
"""An integer type as wide as `stride` bfloat16 pixels: a row's run of them moved as one element."""


def scaled(image: torch.Tensor, scale: float) -> torch.Tensor:
    """`image` in float32 times `scale`; scaled in place in a copy of its own: the same numbers as
    `image.float() * scale` without a second frame-sized allocation (64 80x60 frames on the 2-core
    Xeon: 67 against 126 us of CPU)."""
    return image.to(torch.float32, copy=True).mul_(scale) if scale != 1.0 else image.float()


def space_to_depth(x: torch.Tensor, stride: int, kernel: int) -> torch.Tensor:
    """One-channel frames `x` (B, 1, H, W) in bfloat16, rearranged for the stride-1 convolution that
    `s2d_weight` makes of a `kernel`/`stride` one: (B, stride², H', W'), channels-last, the channel
    of pixel (a, b) of each stride x stride block being a * stride + b. Rows and columns that no
    output of the convolution sees (past its last window) are left out."""
    batch, _, height, width = x.shape
    rows, cols = ((height - kernel) // stride) * stride + kernel, ((width - kernel) // stride) * stride + kernel
    frames = x.to(torch.bfloat16).contiguous()[:, 0, :rows, :cols]
    view = _VIEWS.get(2 * stride)
    if view is not None and width % stride == 0:  # each block row's pixels as one integer: a 4-byte-wide permute
        runs = frames.view(view).view(batch, rows // stride, stride, cols // stride)
        blocks = runs.permute(0, 1, 3, 2).contiguous().view(torch.bfloat16)
    else:
        blocks = frames.reshape(batch, rows // stride, stride, cols // stride, stride).permute(0, 1, 3, 2, 4).contiguous()
    return blocks.view(batch, rows // stride, cols // stride, stride * stride).permute(0, 3, 1, 2)


def s2d_weight(weight: torch.Tensor, stride: int) -> torch.Tensor:
    """A one-channel (O, 1, k, k) kernel of stride `stride` as the (O, stride², k/stride, k/stride)
    kernel of stride 1 over `space_to_depth`'s channels, channels-last."""
    out, _, k, _ = weight.shape
    m = k // stride
    return weight.view(out, m, stride, m, stride).permute(0, 2, 4, 1, 3).reshape(out, stride * stride, m, m).contiguous(memory_format=torch.channels_last)


def patch_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int) -> torch.Tensor:
    """`F.conv2d(x, weight, bias, stride)` (square kernel, no padding) as one matrix product: each
    output position's input patch is a row (k*k*C values, in channels-last order), so the weight's
    gradient is one GEMM too. The result is channels-last, as oneDNN's would be."""
    batch, channels, height, width = x.shape
    out_channels, k = weight.shape[0], weight.shape[-1]
    out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
    nhwc = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    sb, sh, sw, sc = nhwc.stride()
    patches = nhwc.as_strided((batch, out_h, out_w, k, k, channels), (sb, sh * stride, sw * stride, sh, sw, sc))
    rows = patches.reshape(batch * out_h * out_w, k * k * channels)
    out = torch.addmm(bias, rows, weight.permute(0, 2, 3, 1).reshape(out_channels, k * k * channels).t())
    return out.view(batch, out_h, out_w, out_channels).permute(0, 3, 1, 2)


class FirstConv2d(nn.Conv2d):
    """The Nature CNN's first convolution (square kernel, no padding): `nn.Conv2d` over inputs
    multiplied by `input_scale` (1/255 for bytes), with the module's two rules for one channel on a
    CPU. Its parameters are nn.Conv2d's: checkpoints load either way."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, input_scale: float = 1.0) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)
        self.input_scale = input_scale
        """What the input is multiplied by first: 1/255 where the encoder hands over one image's bytes as stored."""

    @property
    def space_to_depth_on_cpu(self) -> bool:
        """Whether this convolution runs space-to-depth in bfloat16 on a CPU (one channel, a kernel the
        stride divides). A copy cast for acting (hpcrl.rl.networks.cast_for_acting) keeps its weights
        float32 and packs the bfloat16 ones derived from them (`PackedFirstConv`), as autocast
        derives them here: the same numbers."""
        return self.in_channels == 1 and self.kernel_size[0] % self.stride[0] == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.space_to_depth_on_cpu and x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            weight, bias = self.s2d_weights()
            return F.conv2d(space_to_depth(x, self.stride[0], self.kernel_size[0]), weight, bias)
        x = scaled(x, self.input_scale)
        return patch_conv(x, self.weight, self.bias, self.stride[0]) if self._as_gemm(x) else super().forward(x)

    def s2d_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stride-1 kernel over `space_to_depth`'s channels, `input_scale` folded in, and the bias."""
        return s2d_weight(self.weight * self.input_scale, self.stride[0]), self.bias

    def _as_gemm(self, x: torch.Tensor) -> bool:
        if not (FIRST_CONV_AS_GEMM and torch.is_grad_enabled() and self.weight.requires_grad) or self.in_channels != 1:
            return False  # acting, or stacked frames: the cheap tests first, the rollout asks at every step
        if x.device.type != "cpu" or x.dtype != torch.float32 or self.weight.dtype != torch.float32:
            return False
        (k, _), (stride, _) = self.kernel_size, self.stride
        positions = ((x.shape[2] - k) // stride + 1) * ((x.shape[3] - k) // stride + 1)
        return x.shape[0] * positions * k * k <= PATCH_CONV_MAX


class PackedFirstConv(PackedLayer):
    """`PackedLayer` for a `FirstConv2d`, which takes the inputs as the encoder hands them over: scaled
    first, or, where `space_to_depth` (the acting copy of an encoder in bfloat16 on a CPU), rearranged
    and convolved with the bfloat16 weights and bias derived from the layer's float32 ones (rounded
    once, as autocast rounds them at every pass): the same numbers as the layer's own path."""

    layer: FirstConv2d

    def __init__(self, layer: FirstConv2d, activation: Callable[[torch.Tensor], torch.Tensor], space_to_depth: bool) -> None:
        super().__init__(layer, activation)
        self.space_to_depth = space_to_depth
        if space_to_depth:
            self._conv = ([0, 0], [1, 1], [1, 1], 1)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.space_to_depth:
            return space_to_depth(x, self.layer.stride[0], self.layer.kernel_size[0])
        return scaled(x, self.layer.input_scale)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.space_to_depth:
            return super().weights()
        weight, bias = self.layer.s2d_weights()
        return weight.to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16)
