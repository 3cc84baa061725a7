"""Evaluation videos: a few episodes of the final policy as MP4, so a result can be watched.

imageio with its ffmpeg wheel (the `video` extra) encodes; frames come from the env's
`rgb_array` rendering, which gymnasium's classic-control envs and ViZDoom both provide.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envs import make_env_here
from hpcrl.rl.networks import obs_to_tensor

FPS = 30


def record_episodes(policy: torch.nn.Module, spec: EnvConfig, episodes: int, seed: int, directory: Path, device: torch.device) -> list[tuple[Path, int]]:
    """Play `episodes` deterministic episodes and write episode-<i>.mp4 files; returns (path, frames)."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise RuntimeError("eval.video needs imageio and imageio-ffmpeg: pip install 'hpcrl[video]'") from None
    directory.mkdir(parents=True, exist_ok=True)
    env = make_env_here(spec, render_mode="rgb_array")
    written = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            frames = [env.render()]
            done = False
            while not done:
                batch = {k: v[None] for k, v in obs.items()} if isinstance(obs, dict) else np.asarray(obs)[None]
                action = policy.act(obs_to_tensor(batch, device), True)
                obs, _, terminated, truncated, _ = env.step(action.cpu().numpy()[0])
                frames.append(env.render())
                done = terminated or truncated
            policy.reset_memory(np.ones(1, dtype=bool))  # the next episode starts without memory
            path = directory / f"episode-{episode}.mp4"
            tmp = directory / f".episode-{episode}.tmp.mp4"
            # macro_block_size=1 keeps odd frame sizes (ViZDoom 160x120 is fine; others need no padding).
            imageio.mimwrite(tmp, [np.asarray(f) for f in frames], fps=FPS, macro_block_size=1)
            os.replace(tmp, path)
            written.append((path, len(frames)))
    finally:
        env.close()
    return written
