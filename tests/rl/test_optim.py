"""The gradient step over one flat buffer: the same learning as torch.optim over separate tensors."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.rl.networks import ActorCritic, NatureCNN
from hpcrl.rl.optim import Adam, GradientStep, RMSprop, flatten_parameters

CPU = torch.device("cpu")
OBS, ACTIONS = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)


def _policy(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(OBS, ACTIONS, [16, 16], "tanh")


def _loss(policy: ActorCritic, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return -policy.evaluate(x, a)[0].mean() + policy.value(x).pow(2).mean()


def test_gradient_step_clips_the_global_norm() -> None:
    net = torch.nn.Linear(4, 1)
    step = GradientStep(net.parameters(), lambda params: torch.optim.SGD(params, lr=1.0), 0.5, "none", CPU)
    before = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
    step(net(torch.full((1, 4), 100.0)).sum())
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    assert (after - before).norm().item() == pytest.approx(0.5, rel=1e-4)  # SGD lr 1: the step is the clipped gradient
    small = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
    step(net(torch.full((1, 4), 1e-3)).sum() * 1e-3)  # a gradient below the limit is left alone
    assert (torch.cat([p.detach().flatten() for p in net.parameters()]) - small).norm().item() < 0.01


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda ps: Adam(ps, lr=1e-2, eps=1e-5), lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=1e-5, fused=True)),
        (lambda ps: RMSprop(ps, lr=7e-4, alpha=0.99, eps=1e-5), lambda ps: torch.optim.RMSprop(ps, lr=7e-4, alpha=0.99, eps=1e-5, foreach=False)),
    ],
    ids=["adam", "rmsprop"],
)
def test_flat_step_learns_exactly_as_torch_optim_over_separate_tensors(ours: Callable, theirs: Callable) -> None:
    """The module's own parameters move, by what torch.optim's implementation computes."""
    flat_policy, reference = _policy(), _policy()
    step = GradientStep(flat_policy.parameters(), ours, 1e9, "none", CPU)  # no clipping: the global norm sums in another order
    ref_params = list(reference.parameters())
    ref_opt = theirs(ref_params)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        x, a = torch.randn(64, 4, generator=gen), torch.randint(0, 2, (64,), generator=gen)
        step(_loss(flat_policy, x, a))
        ref_opt.zero_grad()
        _loss(reference, x, a).backward()
        ref_opt.step()
    for (name, p), q in zip(flat_policy.named_parameters(), ref_params):
        # 1e-6: the fused kernel rounds a tensor's vector body and its scalar tail differently, so
        # a one-element bias on its own can land an ulp away from the same number inside the buffer.
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)
        assert not torch.equal(p, _policy().get_parameter(name)), f"{name} never moved"
    copy = _policy(seed=5)
    copy.load_state_dict(flat_policy.state_dict())  # weights save and load as the module's own tensors
    torch.testing.assert_close(copy.value(x), flat_policy.value(x))


def test_resumed_optimizer_continues_bit_for_bit() -> None:
    x, a = torch.randn(32, 4), torch.randint(0, 2, (32,))
    make = lambda ps: Adam(ps, lr=1e-2, eps=1e-5)  # noqa: E731
    straight = _policy()
    step = GradientStep(straight.parameters(), make, 0.5, "none", CPU)
    for _ in range(10):
        step(_loss(straight, x, a))
    halfway = _policy()
    first = GradientStep(halfway.parameters(), make, 0.5, "none", CPU)
    for _ in range(5):
        first(_loss(halfway, x, a))
    saved = {"policy": halfway.state_dict(), **first.state_dict()}
    resumed = _policy(seed=7)
    resumed.load_state_dict(saved["policy"])
    second = GradientStep(resumed.parameters(), make, 0.5, "none", CPU)
    second.load_state_dict(saved)
    for _ in range(5):
        second(_loss(resumed, x, a))
    for p, q in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(p, q)


def test_flat_buffers_refuse_what_they_cannot_hold() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        flatten_parameters([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))])
    with pytest.raises(ValueError, match="one flat parameter buffer"):
        Adam([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="expected"):  # a checkpoint of the other optimiser
        Adam([torch.nn.Parameter(torch.zeros(2))]).load_state_dict(RMSprop([torch.nn.Parameter(torch.zeros(2))]).state_dict())


def test_fp16_loss_scaling_applies_on_cuda_only() -> None:
    step = GradientStep(_policy().parameters(), lambda ps: Adam(ps), 0.5, "fp16", CPU)
    assert step.scaler is None


def test_a_cnn_keeps_its_channels_last_weights_in_the_flat_buffer_and_learns_as_unflattened() -> None:
    """Convolutions reorder NCHW weights at every call; NatureCNN keeps its weights channels-last,
    and the flat buffer must hold them that way (a plain view would hand back NCHW weights whose
    numbers are in NHWC order: a silently scrambled network)."""
    images, actions = gym.spaces.Box(0, 255, (2, 40, 48), dtype=np.uint8), gym.spaces.Discrete(3)
    torch.manual_seed(0)
    flat_net = ActorCritic(images, actions, [32], "relu")
    plain = ActorCritic(images, actions, [32], "relu")
    plain.load_state_dict(flat_net.state_dict())
    x, a = torch.randint(0, 255, (6, 2, 40, 48), dtype=torch.uint8), torch.randint(0, 3, (6,))
    ours = GradientStep(flat_net.parameters(), lambda ps: Adam(ps, lr=1e-3), 0.5, "none", CPU)
    theirs = torch.optim.Adam(plain.parameters(), lr=1e-3)
    weight = flat_net.encoder.cnn.net[2].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert ours.flat.data.data_ptr() <= weight.data_ptr() < ours.flat.data.data_ptr() + 4 * ours.flat.numel()
    for p, q in zip(flat_net.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(p, q)
    for _ in range(3):
        ours(_loss(flat_net, x, a))
        theirs.zero_grad()
        _loss(plain, x, a).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        theirs.step()
    for p, q in zip(flat_net.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("amp", [True, False])
def test_grey_frames_stay_channels_last_through_a_flattened_cnn(amp: bool) -> None:
    """A one-channel first convolution's weight is contiguous in both layouts; the flat buffer keeps
    its channels-last strides all the same, so every convolution's output and gradient is
    channels-last, as the weights after it are (not an NCHW first layer that each step reorders)."""
    cnn = NatureCNN(1, 60, 80, filters=[16, 32, 32])
    strides = [p.stride() for p in cnn.parameters()]
    flatten_parameters(list(cnn.parameters()))
    assert [p.stride() for p in cnn.parameters()] == strides
    outputs: list[bool] = []
    gradients: list[bool] = []
    channels_last = lambda x: x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()  # noqa: E731

    def watch(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        outputs.append(channels_last(out))
        out.register_hook(lambda grad: gradients.append(channels_last(grad)))

    for conv in (cnn.net[0], cnn.net[2], cnn.net[4]):
        conv.register_forward_hook(watch)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        out = cnn(torch.rand(64, 1, 60, 80))
    out.float().square().sum().backward()
    assert outputs == gradients == [True] * 3
