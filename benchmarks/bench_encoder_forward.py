"""Where an actor runs a CNN policy: the NumPy forward pass actors use (`NumpyPolicy` with its
`NumpyEncoder`) against torch's (`ActorCritic`, no_grad), on one thread, at an actor's batch.

For each case (MinAtar's 10×10×4 frames through its convolution, Atari's 4×84×84 stacks through
the Nature CNN, and each of them through IMPALA's ResNet), both sides take the same weights and the
same observations in the env's dtype (torch's side converts them as the learners do:
`obs_features`), and `--rounds` rounds alternate `--calls` timed calls of each side. Prints the
median µs per call of each and the ratio torch / NumPy (> 1: NumPy is faster).

With `--env ALE/Pong-v5` (needs `rlmq[atari]`), then an actor's loop for the Atari-sized cases: a
vector env of the case's batch of slots stepped by the policy's sampled actions, with the encoder
run by NumPy and by torch (`NumpyPolicy(torch_encoder=...)`, as actors choose by
`images.TORCH_IN_ACTORS`), `--rounds` rounds of `--window-s` each alternating; prints the median env
steps/s of each, the env alone, and what importing torch costs an actor process (seconds, resident MiB).

    python benchmarks/bench_encoder_forward.py --rounds 7 --env ALE/Pong-v5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.helpers: the references

from rlmq.common.service import limit_threads

limit_threads(1)  # as an actor process: before NumPy loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rlmq.common import envs  # noqa: E402
from rlmq.common.models import NumpyPolicy  # noqa: E402
from rlmq.common.schema import EnvSpec, obs_features  # noqa: E402
from rlmq.learners.networks import ActorCritic  # noqa: E402
from tests.helpers.references import to_numpy_params  # noqa: E402

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
    parser.add_argument("--env", default=None, help="an ALE id: also time an actor's loop with each runner")
    parser.add_argument("--window-s", type=float, default=3.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| case | batch | NumPy µs/call | torch µs/call | torch / NumPy |\n|:--|--:|--:|--:|--:|")
    for name in args.cases:
        spec, encoder, hidden, batch = CASES[name]
        torch.manual_seed(0)
        net = ActorCritic(spec, hidden, encoder=encoder).eval()
        policy = NumpyPolicy(to_numpy_params(net), spec, encoder=encoder)
        rng = np.random.default_rng(0)
        obs = (
            (rng.random((batch, *spec.obs_shape)) < 0.3)
            if spec.obs_dtype == "bool"
            else rng.integers(0, 256, (batch, *spec.obs_shape), dtype=np.uint8)
        )

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
    if args.env:
        actor_loops(args)


class ActorLoop:
    """An actor's collection loop without the messaging: sample actions, step the env."""

    def __init__(self, env: object, action_dim: int, slots: int) -> None:
        self.env, self.action_dim, self.slots = env, action_dim, slots
        self.rng = np.random.default_rng(0)
        self.obs = env.reset(seed=0)[0]  # type: ignore[attr-defined]

    def rate(self, policy: NumpyPolicy | None, seconds: float) -> float:
        """Env steps/s over `seconds`; uniformly random actions without a policy (the env alone)."""
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            if policy is None:
                actions = self.rng.integers(0, self.action_dim, self.slots)
            else:
                actions = policy.act(self.obs, self.rng)[0]
            self.obs = self.env.step(actions)[0]  # type: ignore[attr-defined]
            steps += self.slots
        return steps / (time.perf_counter() - start)


def actor_loops(args: argparse.Namespace) -> None:
    """Env steps/s of an actor's loop (act, then step) with the encoder in NumPy and in torch."""
    print("\n| case | slots | env alone | NumPy encoder | torch encoder | torch / NumPy |\n|:--|--:|--:|--:|--:|--:|")
    for name in args.cases:
        spec, encoder, hidden, batch = CASES[name]
        env = envs.make_vector_env(args.env, batch)
        if envs.describe(env, args.env).obs_shape != spec.obs_shape:
            env.close()
            continue
        torch.manual_seed(0)
        params = to_numpy_params(ActorCritic(spec, hidden, encoder=encoder))
        policies = {
            runner: NumpyPolicy(params, spec, encoder=encoder, torch_encoder=runner == "torch")
            for runner in ("numpy", "torch")
        }
        loop = ActorLoop(env, spec.action_dim, batch)
        rates: dict[str, list[float]] = {"alone": [], "numpy": [], "torch": []}
        loop.rate(policies["numpy"], 1.0), loop.rate(policies["torch"], 1.0)
        for _ in range(args.rounds):
            for runner in rates:
                rates[runner].append(loop.rate(policies.get(runner), args.window_s))
        env.close()
        alone, numpy_rate, torch_rate = (float(np.median(r)) for r in rates.values())
        ratio = float(np.median(np.array(rates["torch"]) / np.array(rates["numpy"])))
        print(f"| {name} | {batch} | {alone:,.0f} | {numpy_rate:,.0f} | {torch_rate:,.0f} | {ratio:.2f} |")
    # VmRSS, not ru_maxrss: a child's maximum starts at its parent's (kept across fork and exec).
    probe = (
        "import time; rss = lambda: int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]); "
        "before, start = rss(), time.perf_counter(); import torch; took = time.perf_counter() - start; "
        "print(f'{took:.2f} {(rss() - before) / 1024:.0f}')"
    )
    took, mib = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    print(f"\nimporting torch in an actor process: {took} s, +{mib} MiB resident")


if __name__ == "__main__":
    main()
