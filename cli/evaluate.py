"""`rlmq eval`: a checkpoint's policy played for N episodes (common/episodes.py says how),
deterministic by default, optionally filmed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlmq.common import envs
from rlmq.common.architecture import member_activation
from rlmq.common.config import RunConfig
from rlmq.common.episodes import Evaluation, play_policy
from rlmq.common.models import NumpyPolicy, make_policy
from rlmq.common.schema import EnvSpec
from rlmq.learners import policy_file

VIDEO_FPS = 30


@dataclass(frozen=True)
class Checkpoint:
    """What `rlmq up` wrote to checkpoint.pt, for one member."""

    run_config: RunConfig
    spec: EnvSpec
    member: int
    params: dict[str, np.ndarray]
    version: int
    trained_steps: int  # env steps the member's weights were trained on (0 in checkpoints before it)
    activation: str = ""  # the member's hidden activation where PBT mutated it ("": the run config's)


def load_checkpoint(path: Path, member: int | None = None) -> Checkpoint:
    """A run directory's checkpoint.pt, else its newest learner checkpoint, or either file itself;
    `member` None: the best member's (in a learner checkpoint, member 0: fitness is the
    coordinator's). Raises ValueError naming what is wrong."""
    from rlmq.learners.checkpoint import latest_file

    file = path / "checkpoint.pt" if path.is_dir() else path
    if path.is_dir() and not file.is_file():  # a run that did not end (killed, or still running)
        file = latest_file(path / "checkpoints") or file
    if not file.is_file():
        raise ValueError(
            f"no checkpoint at {file}: give a run directory of `rlmq up`, its checkpoint.pt or "
            "a learner checkpoint (RUN_DIR/checkpoints/rank0/*.pt)"
        )
    record = policy_file.load(file)
    chosen = record.best_member if member is None else member
    if chosen not in record.members:
        raise ValueError(
            f"{file}: member {chosen} is not in it (members: {', '.join(map(str, sorted(record.members)))})"
        )
    saved = record.members[chosen]
    return Checkpoint(
        record.run_config,
        record.env_spec,
        chosen,
        saved.params,
        saved.version,
        saved.trained_steps,
        member_activation(saved.hyperparams),
    )


def policy_of(checkpoint: Checkpoint) -> NumpyPolicy:
    """The member's policy, as its actors ran it; ValueError for weights that do not fit."""
    try:
        run, params, spec = checkpoint.run_config, checkpoint.params, checkpoint.spec
        return make_policy(run, params, spec, checkpoint.trained_steps, activation=checkpoint.activation)
    except KeyError as exc:
        raise ValueError(f"the checkpoint's weights do not fit its policy: missing {exc}") from exc


def evaluate(
    checkpoint: Checkpoint, episodes: int, seed: int = 0, deterministic: bool = True, video: Path | None = None
) -> Evaluation:
    policy = policy_of(checkpoint)
    run = checkpoint.run_config
    found = envs.probe(run.env_id, frame_stack=run.frame_stack)
    if found != checkpoint.spec:
        raise ValueError(f"{run.env_id} now has spaces {found}, the checkpoint was trained on {checkpoint.spec}")
    frames: list[np.ndarray] | None = [] if video is not None else None
    result = play_policy(policy, run.env_id, checkpoint.spec, episodes, seed, deterministic, frames, run.frame_stack)
    if video is not None and frames:
        write_video(video, frames, fps=VIDEO_FPS)
    return result


def write_video(path: Path, frames: list[Any], fps: int) -> None:
    """An MP4 (needs imageio-ffmpeg) or a GIF (imageio alone), from rgb_array frames."""
    try:
        import imageio.v2 as imageio
    except ImportError as exc:
        raise ValueError("--video needs imageio: pip install imageio (and imageio-ffmpeg for .mp4)") from exc
    if path.suffix.lower() == ".gif":
        imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    elif path.suffix.lower() == ".mp4":
        try:
            imageio.mimsave(path, frames, fps=fps)
        except (ImportError, ValueError, RuntimeError) as exc:
            raise ValueError(f"writing {path} needs imageio-ffmpeg: pip install imageio-ffmpeg ({exc})") from exc
    else:
        raise ValueError(f"--video {path}: name a .mp4 or .gif file")


def summary(checkpoint: Checkpoint, result: Evaluation, deterministic: bool) -> str:
    lengths = np.asarray(result.lengths)
    return (
        f"{checkpoint.run_config.algo} on {checkpoint.run_config.env_id}, member {checkpoint.member} "
        f"(version {checkpoint.version}, trained on {checkpoint.trained_steps:,} env steps), "
        f"{'deterministic' if deterministic else 'sampled'}:\n"
        f"  return {result.mean:.1f} ± {result.std:.1f} over {len(result.returns)} episodes "
        f"(min {min(result.returns):.1f}, max {max(result.returns):.1f}); "
        f"length {lengths.mean():.0f} (min {lengths.min()}, max {lengths.max()})"
    )
