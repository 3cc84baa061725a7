"""Networks: encoders per observation space, the hand-written action distributions, running
observation statistics, the GRU core's episode resets, frame stacking, mixed precision."""

from __future__ import annotations

import copy
import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl import packed
from hpcrl.rl.envs import make_env
from hpcrl.rl.networks import CPU_BF16, ActorCritic, Encoder, NatureCNN, QNetwork, RunningNorm, bf16_pays, cast_for_acting, obs_to_tensor

torch.manual_seed(0)


@pytest.mark.parametrize("shape", [(4, 84, 84), (1, 60, 80), (3, 120, 160)])
def test_nature_cnn_takes_any_resolution(shape: tuple[int, int, int]) -> None:
    cnn = NatureCNN(*shape)
    out = cnn(torch.zeros(2, *shape))
    assert out.shape == (2, cnn.out_dim)
    assert NatureCNN(4, 84, 84).out_dim == 3136  # the DQN paper's 7 x 7 x 64
    with pytest.raises(ValueError, match="40x30 are too small for the Nature CNN"):
        NatureCNN(1, 30, 40)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_train_cnn_channels_are_the_filters_of_the_policy_evaluation_rebuilds(algo: str) -> None:
    """`train.cnn_channels` reaches the CNN the trainer builds and the one evaluation rebuilds from a
    checkpoint (both through make_policy), and a checkpoint of the Nature CNN does not load into it."""
    from hpcrl.config.load import experiment_from_dict
    from hpcrl.rl.train import algorithm_class

    pixels = gym.spaces.Box(0, 255, (1, 60, 80), dtype=np.uint8)
    make = algorithm_class(algo).make_policy
    half = experiment_from_dict({"name": "n", "algo": algo, "train": {"cnn_channels": [16, 32, 8]}}).train
    policy = make(half, pixels, gym.spaces.Discrete(3))
    convs = [m for m in policy.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 8]
    assert [(c.kernel_size, c.stride) for c in convs] == [((8, 8), (4, 4)), ((4, 4), (2, 2)), ((3, 3), (1, 1))]
    rebuilt = make(half, pixels, gym.spaces.Discrete(3))
    rebuilt.load_state_dict(policy.state_dict())
    nature = make(experiment_from_dict({"name": "n", "algo": algo}).train, pixels, gym.spaces.Discrete(3))
    assert [m.out_channels for m in nature.modules() if isinstance(m, torch.nn.Conv2d)] == [32, 64, 64]
    with pytest.raises(RuntimeError, match="size mismatch"):
        nature.load_state_dict(policy.state_dict())


def test_uint8_pixels_are_scaled_inside_the_network() -> None:
    """Bytes cross to the device; the encoder sees [0, 1] either way (its CNN scales one image itself)."""
    space = gym.spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8)
    enc = Encoder(space, [8], "relu")
    plain = NatureCNN(1, 36, 36)
    plain.load_state_dict(enc.cnn.state_dict())
    pixels = torch.randint(0, 256, (3, 1, 36, 36), dtype=torch.uint8)
    torch.testing.assert_close(enc(pixels), enc.mlp(plain(pixels.float() / 255)))


def test_dict_observation_concatenates_images_and_vectors() -> None:
    """Habitat's depth (float in [0, 1]) and RGB (bytes) share one CNN; the pointgoal joins after it."""
    space = gym.spaces.Dict({
        "depth": gym.spaces.Box(0.0, 1.0, (1, 64, 64), dtype=np.float32),
        "rgb": gym.spaces.Box(0, 255, (3, 64, 64), dtype=np.uint8),
        "pointgoal": gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float32),
    })  # fmt: skip
    enc = Encoder(space, [32], "relu")
    assert enc.cnn.net[0].in_channels == 4
    assert enc.mlp[0].in_features == enc.cnn.out_dim + 2
    obs = {"depth": torch.rand(5, 1, 64, 64), "rgb": torch.randint(0, 256, (5, 3, 64, 64), dtype=torch.uint8), "pointgoal": torch.randn(5, 2)}
    assert enc(obs).shape == (5, 32)
    changed = dict(obs, pointgoal=obs["pointgoal"] + 1)
    assert not torch.allclose(enc(obs), enc(changed))  # the goal reaches the features

    with pytest.raises(ValueError, match="one resolution"):
        Encoder(gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (1, 8, 8)), "b": gym.spaces.Box(0, 1, (1, 9, 9))}), [4], "relu")


def test_categorical_head_matches_torch_distributions() -> None:
    policy = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4), [16], "tanh")
    obs = torch.randn(6, 3)
    action, logprob, _, _ = policy.step(obs)
    dist = torch.distributions.Categorical(logits=policy.actor_head.linear(policy.actor_encoder(obs)))
    torch.testing.assert_close(logprob, dist.log_prob(action))
    newlogprob, entropy, _ = policy.evaluate(obs, action)
    torch.testing.assert_close(newlogprob, logprob)
    torch.testing.assert_close(entropy, dist.entropy())


def test_gumbel_max_sampling_draws_from_the_policy() -> None:
    head = ActorCritic(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(3), [4], "tanh").actor_head
    logp = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).expand(60_000, 3)
    freq = torch.bincount(head.sample(logp), minlength=3).float() / 60_000
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.01, rtol=0)


def test_gaussian_head_matches_torch_distributions_and_clips_for_the_env() -> None:
    space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 0.5], np.float32))
    policy = ActorCritic(gym.spaces.Box(-1, 1, (3,)), space, [16], "tanh")
    with torch.no_grad():
        policy.actor_head.log_std.fill_(math.log(2.0))  # wide enough that some samples leave the box
    obs = torch.randn(500, 3)
    action, logprob, _, _ = policy.step(obs)
    mean = policy.actor_head.linear(policy.actor_encoder(obs))
    dist = torch.distributions.Normal(mean, torch.full_like(mean, 2.0))
    torch.testing.assert_close(logprob, dist.log_prob(action).sum(-1))
    _, entropy, _ = policy.evaluate(obs, action)
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    clipped = policy.clip_action(action)
    assert (action.abs() > 1).any()  # the stored action stays unclipped (its log-prob is exact) ...
    assert clipped[:, 0].min() >= -1 and clipped[:, 0].max() <= 1 and clipped[:, 1].min() >= 0 and clipped[:, 1].max() <= 0.5


def test_running_norm_matches_the_statistics_of_everything_seen() -> None:
    norm = RunningNorm((3,))
    data = np.random.default_rng(0).normal([5.0, -2.0, 100.0], [1.0, 0.1, 30.0], size=(4000, 3))
    for chunk in np.split(data, 8):
        norm.update(torch.as_tensor(chunk).view(50, 10, 3))  # rollout-shaped (T, N, features)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-4)
    out = norm(torch.as_tensor(data, dtype=torch.float32))
    np.testing.assert_allclose(out.mean(0).numpy(), 0, atol=1e-3)
    np.testing.assert_allclose(out.std(0).numpy(), 1, atol=1e-3)


def test_observation_statistics_travel_with_the_policy_weights() -> None:
    """Evaluation rebuilds the policy from the checkpoint's weights alone: the normaliser must be in them."""
    space = gym.spaces.Box(-np.inf, np.inf, (2,))
    trained = ActorCritic(space, gym.spaces.Discrete(2), [8], "tanh", normalize_obs=True)
    trained.obs_norm.update(torch.randn(100, 2) * 10 + 3)
    rebuilt = ActorCritic(space, gym.spaces.Discrete(2), [8], "tanh", normalize_obs=True)
    rebuilt.load_state_dict(trained.state_dict())
    obs = torch.randn(4, 2) * 10
    torch.testing.assert_close(rebuilt.value(obs), trained.value(obs))
    with pytest.raises(ValueError, match="normalize_obs"):
        ActorCritic(gym.spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8), gym.spaces.Discrete(2), [8], "relu", normalize_obs=True)


def test_gru_replays_a_rollout_exactly_and_forgets_at_episode_starts() -> None:
    """The update's sequence pass must reproduce the rollout's step-by-step values, and the state
    must be zeroed where `first` marks a new episode."""
    policy = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), [8], "tanh", recurrent_size=6)
    steps, envs = 7, 4
    obs = torch.randn(steps, envs, 3)
    firsts = torch.zeros(steps, envs)
    firsts[0] = 1
    firsts[4, 1] = 1
    state = policy.initial_state(envs, torch.device("cpu"))
    start_state, values, actions = state, [], []
    with torch.no_grad():
        for t in range(steps):
            action, _, value, state = policy.step(obs[t], state, firsts[t])
            actions.append(action)
            values.append(value)
        _, _, replayed = policy.evaluate(obs.view(-1, 3), torch.stack(actions).view(-1), start_state, firsts.view(-1))
    torch.testing.assert_close(replayed.view(steps, envs), torch.stack(values))
    # env 1 from step 4 on is a fresh episode: the same as running it alone from a zero state
    with torch.no_grad():
        _, _, seq = policy.evaluate(obs[4:, 1], torch.stack(actions)[4:, 1], policy.initial_state(1, torch.device("cpu")), torch.tensor([1.0, 0, 0]))
    torch.testing.assert_close(seq, torch.stack(values)[4:, 1])


def test_evaluation_memory_is_reset_per_finished_env() -> None:
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), [8], "tanh", recurrent_size=4)
    policy.act(torch.randn(3, 2), True)
    policy.reset_memory(np.array([False, True, False]))
    assert policy._memory[0, 1].abs().sum() == 0 and policy._memory[0, 0].abs().sum() > 0


def test_qnetwork_and_image_policy_shapes() -> None:
    pixels = gym.spaces.Box(0, 255, (4, 60, 80), dtype=np.uint8)
    q = QNetwork(pixels, gym.spaces.Discrete(3), [64], "relu")
    obs = torch.randint(0, 256, (2, 4, 60, 80), dtype=torch.uint8)
    assert q(obs).shape == (2, 3) and q.act(obs, True).shape == (2,)
    ac = ActorCritic(pixels, gym.spaces.Discrete(3), [64], "relu")
    assert ac.shared  # one CNN for actor and critic
    action, logprob, value, _ = ac.step(obs)
    assert action.shape == logprob.shape == value.shape == (2,)


def test_frame_stacking_merges_frames_on_channels() -> None:
    class Pixels(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (1, 8, 8), dtype=np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):  # noqa: ANN001, ANN202
            self.t = 0
            return np.zeros((1, 8, 8), np.uint8), {}

        def step(self, action):  # noqa: ANN001, ANN202
            self.t += 1
            return np.full((1, 8, 8), self.t, np.uint8), 0.0, False, False, {}

    if "hpcrl-test/Pixels-v0" not in gym.registry:
        gym.register("hpcrl-test/Pixels-v0", entry_point=Pixels)
    env = make_env(EnvConfig(id="hpcrl-test/Pixels-v0", frame_stack=4))
    assert env.observation_space.shape == (4, 8, 8)
    env.reset()
    for _ in range(5):
        obs, *_ = env.step(0)
    assert obs[:, 0, 0].tolist() == [2, 3, 4, 5]  # oldest first, newest last
    with pytest.raises(ValueError, match="frame_stack needs Box"):
        make_env(EnvConfig(id="Blackjack-v1", frame_stack=2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixed precision applies on CUDA only")
def test_amp_encoder_runs_reduced_precision_and_returns_float32() -> None:
    pixels = gym.spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)
    policy = ActorCritic(pixels, gym.spaces.Discrete(3), [64], "relu", amp="bf16").cuda()
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8, device="cuda")
    _, logprob, value, _ = policy.step(obs)
    assert logprob.dtype == value.dtype == torch.float32


def _twins(amp: str) -> tuple[ActorCritic, ActorCritic, torch.Tensor]:
    """A pixel policy with `amp`, the same weights without, and a batch of frames."""
    pixels = gym.spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8)
    policy = ActorCritic(pixels, gym.spaces.Discrete(3), [16], "relu", amp=amp)
    plain = ActorCritic(pixels, gym.spaces.Discrete(3), [16], "relu")
    plain.load_state_dict(policy.state_dict())
    obs = obs_to_tensor(np.random.default_rng(0).integers(0, 256, (8, 1, 36, 36), dtype=np.uint8), torch.device("cpu"))
    return policy, plain, obs


def test_fp16_is_ignored_on_cpu() -> None:
    policy, plain, obs = _twins("fp16")
    torch.testing.assert_close(policy.value(obs), plain.value(obs), rtol=0, atol=0)


_CPUINFO = "processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: some CPU\nflags\t\t: fpu sse2 avx2 {flags} fma\n\n"


@pytest.mark.parametrize(
    ("vendor", "flags", "pays"),
    [
        ("GenuineIntel", "avx512f avx512_bf16 amx_bf16 amx_tile", True),  # AMX tiles
        ("GenuineIntel", "avx512f avx512_bf16", False),  # the project's Xeon: 26 ms a CNN step against 20 in float32
        ("AuthenticAMD", "avx512f avx512_bf16", True),  # Zen 4 / 5: PPO's update 115 ms of CPU against 173
        ("AuthenticAMD", "avx512f", False),
        ("AuthenticAMD", "", False),  # AVX2 only
        ("", "", False),  # /proc/cpuinfo without those lines (another architecture)
        ("", "avx512f avx512_bf16", False),  # no vendor named: not measured, so float32
    ],
)
def test_bf16_runs_on_the_cpus_where_it_was_measured_faster(vendor: str, flags: str, pays: bool) -> None:
    text = "".join(_CPUINFO.format(n=n, vendor=vendor, flags=flags) for n in range(2))
    assert bf16_pays(text) is pays
    assert bf16_pays(text.replace(" avx512_bf16", " avx512_bf16_x")) is ("amx_bf16" in flags)  # a flag is a word, not a prefix


def test_bf16_on_cpu_follows_native_support() -> None:
    """Where the CPU computes bfloat16 natively the encoder runs in it (float32 out, close to the
    float32 policy, not equal to it: it did run reduced); elsewhere bf16 is ignored, bit for bit."""
    policy, plain, obs = _twins("bf16")
    mine, theirs = policy.value(obs), plain.value(obs)
    assert mine.dtype == torch.float32
    if CPU_BF16:
        torch.testing.assert_close(mine, theirs, rtol=0.05, atol=0.05)
        assert not torch.equal(mine, theirs)
    else:
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


OBSERVATIONS = {
    "pixels": gym.spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8),
    "odd pixels": gym.spaces.Box(0, 255, (1, 39, 42), dtype=np.uint8),  # sides the first convolution's stride does not divide
    "vector": gym.spaces.Box(-1, 1, (5,), dtype=np.float32),
    "dict": gym.spaces.Dict({"depth": gym.spaces.Box(0, 1, (1, 36, 36), dtype=np.float32), "goal": gym.spaces.Box(-1, 1, (2,), dtype=np.float32)}),
}


def _observations(space: gym.Space, batch: int, rng: np.random.Generator) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _observations(s, batch, rng) for k, s in space.spaces.items()}
    if space.dtype == np.uint8:
        return obs_to_tensor(rng.integers(0, 256, (batch, *space.shape), dtype=np.uint8), torch.device("cpu"))
    return obs_to_tensor(rng.uniform(-1, 1, (batch, *space.shape)).astype(np.float32), torch.device("cpu"))


def _same_steps(policy: ActorCritic, acting: ActorCritic, obs: Any) -> None:
    with torch.no_grad():
        ours = policy.step(obs, None, None, with_value=True, generator=torch.Generator().manual_seed(1))
        theirs = acting.step(obs, None, None, with_value=True, generator=torch.Generator().manual_seed(1))
    for x, y in zip(ours, theirs):
        if x is not None:
            assert torch.equal(x, y)


@pytest.mark.parametrize("amp", ["bf16", "none"])
@pytest.mark.parametrize("kind", sorted(OBSERVATIONS))
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_a_copy_cast_for_acting_acts_as_the_policy_bit_for_bit(amp: str, kind: str, activation: str) -> None:
    """The background rollout's copy keeps its encoders' weights in the autocast dtype (cast once
    per update, not at every step), and a CNN's layers packed for oneDNN (hpcrl.rl.packed): the same
    actions, log-probabilities and values as the policy, for any batch, and again after new weights
    are copied in as the rollout's refresh does, or loaded from a checkpoint (a packing that missed
    them would act with the old weights); a deep copy of it too, with weights of its own."""
    space = OBSERVATIONS[kind]
    policy = ActorCritic(space, gym.spaces.Discrete(3), [16], activation, amp=amp)
    acting = cast_for_acting(copy.deepcopy(policy), torch.device("cpu"))
    reduced = {p.dtype for p in acting.parameters()} - {torch.float32}
    assert reduced == ({torch.bfloat16} if amp == "bf16" and CPU_BF16 else set())
    if kind.endswith("pixels"):  # the grey frames' first convolution derives its bfloat16 weights from float32 ones
        assert {p.dtype for p in acting.encoder.cnn.net[0].parameters()} == {torch.float32}
    cnn = acting.encoder.cnn if acting.shared else None
    assert (cnn is not None and cnn.packed is not None) == (kind != "vector" and packed.PACKS)
    rng = np.random.default_rng(0)
    _same_steps(policy, acting, _observations(space, 8, rng))  # packed at the first step
    with torch.no_grad():
        for p in policy.parameters():  # an update moved the weights
            p.add_(torch.randn_like(p) * 0.1)
        for mine, theirs in zip(acting.parameters(), policy.parameters()):
            mine.copy_(theirs)
    for batch in (8, 1, 3):
        _same_steps(policy, acting, _observations(space, batch, rng))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    acting.load_state_dict(policy.state_dict())
    _same_steps(policy, acting, _observations(space, 8, rng))
    twin = copy.deepcopy(acting)  # its packed layers are its own: new weights in the twin alone are what it acts with
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    twin.load_state_dict(policy.state_dict())
    _same_steps(policy, twin, _observations(space, 8, rng))


def test_a_packed_acting_copy_still_computes_gradients_when_asked() -> None:
    """oneDNN's packed ops have no backward pass: with gradients on, the acting copy's CNN runs as
    torch's layers, and its gradients are the policy's."""
    space = OBSERVATIONS["pixels"]
    policy = ActorCritic(space, gym.spaces.Discrete(3), [16], "relu")
    acting = cast_for_acting(copy.deepcopy(policy), torch.device("cpu"))
    obs = _observations(space, 4, np.random.default_rng(0))
    with torch.no_grad():
        acting.value(obs)  # packed
    for net in (policy, acting):
        net.value(obs).sum().backward()
    grads = [(mine.grad, theirs.grad) for mine, theirs in zip(acting.parameters(), policy.parameters()) if theirs.grad is not None]
    assert len(grads) == 10  # the weights and biases of the 3 convolutions, the hidden layer and the value head
    assert all(torch.equal(mine, theirs) for mine, theirs in grads)


def test_a_packed_acting_copy_follows_torch_where_onednn_is_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that switches oneDNN off (`torch.backends.mkldnn.enabled = False`) gets torch's own
    kernels from the acting copy too: the same numbers as the policy's there."""
    space = OBSERVATIONS["pixels"]
    policy = ActorCritic(space, gym.spaces.Discrete(3), [16], "relu")
    acting = cast_for_acting(copy.deepcopy(policy), torch.device("cpu"))
    rng = np.random.default_rng(0)
    _same_steps(policy, acting, _observations(space, 8, rng))  # packed
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    _same_steps(policy, acting, _observations(space, 8, rng))
