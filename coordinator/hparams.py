"""TensorBoard's HParams summaries, built from its protocol buffers (its own helpers for them
import TensorFlow): an experiment naming the hyperparameters and the metric, and a session's start
with a member's values. Written as `torch.utils.tensorboard.SummaryWriter.add_hparams` writes them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _summary(tag: str, **data: Any) -> Any:
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    content = HParamsPluginData(version=PLUGIN_DATA_VERSION, **data).SerializeToString()
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content))
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata)])


def experiment(hyperparams: Mapping[str, float], metric_tag: str) -> Any:
    """The experiment: these hyperparameters (numbers), judged by the scalar `metric_tag`."""
    from tensorboard.plugins.hparams.api_pb2 import DataType, Experiment, HParamInfo, MetricInfo, MetricName
    from tensorboard.plugins.hparams.metadata import EXPERIMENT_TAG

    infos = [HParamInfo(name=name, type=DataType.Value("DATA_TYPE_FLOAT64")) for name in sorted(hyperparams)]
    found = Experiment(hparam_infos=infos, metric_infos=[MetricInfo(name=MetricName(tag=metric_tag))])
    return _summary(EXPERIMENT_TAG, experiment=found)


def session_start(hyperparams: Mapping[str, float], group: str) -> Any:
    """A session with these values, in `group` (a member's sessions, one per set of values)."""
    from tensorboard.plugins.hparams.metadata import SESSION_START_INFO_TAG
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionStartInfo

    info = SessionStartInfo(group_name=group)
    for name, value in hyperparams.items():
        info.hparams[name].number_value = float(value)
    return _summary(SESSION_START_INFO_TAG, session_start_info=info)
