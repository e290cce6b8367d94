"""Where an actor runs a CNN policy: the NumPy forward pass actors use (`NumpyPolicy` with its
`NumpyEncoder`) against torch's (`ActorCritic`, no_grad), on one thread, at an actor's batch.

For each case (MinAtar's 10×10×4 frames through its convolution, Atari's 4×84×84 stacks through
the Nature CNN, and each of them through IMPALA's ResNet), both sides take the same weights and the same observations in the env's dtype
(torch's side converts them as the learners do: `obs_features`), and `--rounds` rounds alternate
`--calls` timed calls of each side. Prints the median µs per call of each and the ratio
torch / NumPy (> 1: NumPy is faster).

    python benchmarks/bench_encoder_forward.py --rounds 7
"""

from __future__ import annotations

import argparse
import time

from rlmq.common.service import limit_threads

limit_threads(1)  # as an actor process: before NumPy loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rlmq.common.models import NumpyPolicy  # noqa: E402
from rlmq.common.schema import EnvSpec, obs_features  # noqa: E402
from rlmq.learners.networks import ActorCritic, to_numpy_params  # noqa: E402

MINATAR = EnvSpec(obs_shape=(10, 10, 4), obs_dtype="bool", action_kind="discrete", action_dim=3)
ATARI = EnvSpec(obs_shape=(4, 84, 84), obs_dtype="uint8", action_kind="discrete", action_dim=6)
CASES = {  # name: (observations, encoder, hidden sizes of the heads, actor batch)
    "minatar": (MINATAR, "minatar", (256,), 16),
    "nature": (ATARI, "nature", (512,), 8),
    "impala-minatar": (MINATAR, "impala", (256,), 16),
    "impala-atari": (ATARI, "impala", (256,), 8),
}


def per_call_us(call: object, calls: int) -> float:
    assert callable(call)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| case | batch | NumPy µs/call | torch µs/call | torch / NumPy |\n|:--|--:|--:|--:|--:|")
    for name in args.cases:
        spec, encoder, hidden, batch = CASES[name]
        torch.manual_seed(0)
        net = ActorCritic(spec, hidden, encoder=encoder).eval()
        policy = NumpyPolicy(to_numpy_params(net), spec, encoder=encoder)
        rng = np.random.default_rng(0)
        obs = (rng.random((batch, *spec.obs_shape)) < 0.3) if spec.obs_dtype == "bool" else \
            rng.integers(0, 256, (batch, *spec.obs_shape), dtype=np.uint8)  # fmt: skip

        def torch_forward(net: ActorCritic = net, obs: np.ndarray = obs, spec: EnvSpec = spec) -> None:
            with torch.no_grad():
                net.policy(net.features(torch.from_numpy(obs_features(obs, spec))))

        def numpy_forward(policy: NumpyPolicy = policy, obs: np.ndarray = obs) -> None:
            policy.forward(obs)

        numpy_forward(), torch_forward()
        times: dict[str, list[float]] = {"numpy": [], "torch": []}
        for _ in range(args.rounds):
            times["numpy"].append(per_call_us(numpy_forward, args.calls))
            times["torch"].append(per_call_us(torch_forward, args.calls))
        numpy_us, torch_us = (float(np.median(t)) for t in times.values())
        print(f"| {name} | {batch} | {numpy_us:,.0f} | {torch_us:,.0f} | {torch_us / numpy_us:.2f} |")


if __name__ == "__main__":
    main()
