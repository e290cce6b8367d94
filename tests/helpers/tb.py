"""The run's TensorBoard curves as TensorBoard's own reader (`EventAccumulator`) reads them."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the TensorBoard run in `directory`: its (step, value) points."""
    found = EventAccumulator(str(directory))
    found.Reload()
    return {tag: [(e.step, e.value) for e in found.Scalars(tag)] for tag in found.Tags()["scalars"]}


def session_hparams(directory: Path) -> dict[str, float]:
    """The hyperparameters of the HParams session started in `directory`."""
    found = EventAccumulator(str(directory))
    found.Reload()
    content = found.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    return {k: v.number_value for k, v in HParamsPluginData.FromString(content).session_start_info.hparams.items()}


def sessions(member_dir: Path) -> list[dict[str, float]]:
    """A member's HParams sessions (`hparams_S/`), in the order they started."""
    found = sorted(member_dir.glob("hparams_*"), key=lambda d: int(d.name.partition("_")[2]))
    return [session_hparams(d) for d in found]
