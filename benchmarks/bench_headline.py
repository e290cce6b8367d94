"""The headline run: `rlmq up` with 64 actors and 4 learners on CartPole-v1 for 200k env steps, and
the memory every process of it holds.

Runs `python -m rlmq.cli up --actors 64 --learners 4 --env CartPole-v1 --total-steps 200000
--run-dir DIR` and, every `--interval-s` while it runs, walks /proc for the supervisor's children
and their descendants (parent links from /proc/PID/stat) and reads each one's VmRSS from
/proc/PID/status (no psutil). Each process is labelled from its command line (actor-N, learner-N,
coordinator, redis). Reported: per-actor RSS (median and max over actors of each actor's peak),
each learner's peak, the coordinator's, Redis's, and the peak of the total (the sum over all the
supervisor's descendants at one sample); the supervisor's own peak is shown apart (it imports torch
and matplotlib at the end to write the checkpoint and plot). RSS counts shared pages (libraries,
NumPy) in every process, so the total overstates what the run needs; `--pss` also samples the
proportional set size (/proc/PID/smaps_rollup), whose sum does not. From DIR/summary.json: `startup_s` (launch → first
env step), `train_wall_s`, `success`, env steps at the end (parsed from `detail`: `env_steps` keeps
counting while actors wind down); and the `up` process's wall time and exit code.

    python benchmarks/bench_headline.py --json runs/bench_headline.json
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass
class Process:
    label: str
    peak_rss_kb: int = 0
    peak_pss_kb: int = 0
    samples: int = 0


@dataclass
class Sampler:
    root: int  # the supervisor's pid
    with_pss: bool
    processes: dict[int, Process] = field(default_factory=dict)
    peak_total_rss_kb: int = 0
    peak_total_pss_kb: int = 0
    samples: int = 0

    def sample(self) -> None:
        total_rss = total_pss = 0  # the supervisor's descendants only; its own peak is kept apart
        for pid in [self.root, *descendants(self.root)]:
            rss = proc_kb(pid, "status", "VmRSS")
            if rss is None:
                continue  # gone since the walk, or a zombie
            pss = (proc_kb(pid, "smaps_rollup", "Pss") or 0) if self.with_pss else 0
            proc = self.processes.get(pid)
            if proc is None or proc.label in ("starting", "other"):  # before (or during) exec
                proc = self.processes[pid] = Process("supervisor" if pid == self.root else label(pid))
            proc.peak_rss_kb, proc.peak_pss_kb = max(proc.peak_rss_kb, rss), max(proc.peak_pss_kb, pss)
            proc.samples += 1
            if pid != self.root:
                total_rss, total_pss = total_rss + rss, total_pss + pss
        self.peak_total_rss_kb = max(self.peak_total_rss_kb, total_rss)
        self.peak_total_pss_kb = max(self.peak_total_pss_kb, total_pss)
        self.samples += 1


def parents() -> dict[int, int]:
    """pid → ppid for every process now."""
    found = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        found[int(entry.name)] = int(fields[1])
    return found


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def proc_kb(pid: int, file: str, key: str) -> int | None:
    """A `key: N kB` line of /proc/PID/<file> (status, smaps_rollup), or None once it is gone."""
    try:
        for line in (PROC / str(pid) / file).read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def label(pid: int) -> str:
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    if any("valkey-server" in a or "redis-server" in a for a in argv):
        return "redis"
    if "rlmq.cli" not in argv:
        return Path(argv[0]).name or "other"
    command = argv[argv.index("rlmq.cli") + 1]
    if command == "up":
        return "starting"  # forked by the supervisor, not yet exec'd
    if command == "actor" and "--name" in argv:
        return argv[argv.index("--name") + 1]
    if command == "learner" and "--rank" in argv:
        return f"learner-{argv[argv.index('--rank') + 1]}"
    return command


def steps_at_end(summary: dict[str, Any]) -> int | None:
    """The coordinator's count when it ended the run: "... at N env steps" / "N env steps ≥ ..."."""
    found = re.search(r"(\d+) env steps", summary.get("detail") or "")
    return int(found.group(1)) if found else summary.get("env_steps")


def num(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def mib(kb: float) -> float:
    return kb / 1024


def tensorboard_files(run_dir: Path) -> dict[str, Any]:
    """The run's TensorBoard event files: how many, how many processes wrote them (an event file's
    name ends in its writer's pid and a counter), and their bytes."""
    files = list((run_dir / "tb").rglob("events.out.tfevents.*"))
    return {
        "files": len(files),
        "writers": len({f.name.split(".")[-2] for f in files}),
        "bytes": sum(f.stat().st_size for f in files),
    }


def report(
    sampler: Sampler, summary: dict[str, Any], code: int, wall: float, with_pss: bool, run_dir: Path
) -> dict[str, Any]:
    by_role: dict[str, list[Process]] = {}
    for proc in sampler.processes.values():
        role = proc.label.rsplit("-", 1)[0] if proc.label[-1:].isdigit() else proc.label
        by_role.setdefault(role, []).append(proc)
    actors = [p.peak_rss_kb for p in by_role.get("actor", [])]
    result: dict[str, Any] = {
        "exit_code": code,
        "up_wall_s": wall,
        "startup_s": summary.get("startup_s"),
        "train_wall_s": summary.get("train_wall_s"),
        "env_steps": steps_at_end(summary),
        "env_steps_summary": summary.get("env_steps"),
        "success": summary.get("success"),
        "detail": summary.get("detail"),
        "samples": sampler.samples,
        "actor_processes": len(actors),  # restarted actors count once per process
        "actor_rss_mib_median": mib(statistics.median(actors)) if actors else None,
        "actor_rss_mib_max": mib(max(actors)) if actors else None,
        "learner_rss_mib": {
            p.label: mib(p.peak_rss_kb) for p in sorted(by_role.get("learner", []), key=lambda p: p.label)
        },
        "other_rss_mib": {
            p.label: mib(p.peak_rss_kb) for role, ps in by_role.items() if role not in ("actor", "learner") for p in ps
        },
        "total_rss_mib_peak": mib(sampler.peak_total_rss_kb),
        "total_pss_mib_peak": mib(sampler.peak_total_pss_kb) if with_pss else None,
        "tensorboard": tensorboard_files(run_dir),
    }
    print(
        f"exit code {code}, `rlmq up` wall {wall:.1f} s, start-up (launch → first env step) "
        f"{num(result['startup_s'])} s, training {num(result['train_wall_s'])} s, "
        f"{result['env_steps']} env steps ({result['detail']})"
    )
    if actors:
        print(
            f"actors   : {len(actors)} processes, peak RSS median {result['actor_rss_mib_median']:.1f} MiB, "
            f"max {result['actor_rss_mib_max']:.1f} MiB"
        )
    for name, value in {**result["learner_rss_mib"], **result["other_rss_mib"]}.items():
        print(f"{name:<9}: peak RSS {value:.1f} MiB")
    print(
        f"total    : peak RSS {result['total_rss_mib_peak']:.1f} MiB "
        "(sum over the supervisor's descendants at one sample; "
        f"{sampler.samples} samples)" + (f", peak PSS {result['total_pss_mib_peak']:.1f} MiB" if with_pss else "")
    )
    tb = result["tensorboard"]
    print(f"tensorboard: {tb['files']} event files from {tb['writers']} process(es), {tb['bytes'] / 1024:.0f} KiB")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=64)
    parser.add_argument("--learners", type=int, default=4)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument(
        "--run-dir", type=Path, default=Path("runs") / f"bench-headline-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    parser.add_argument("--interval-s", type=float, default=0.5, help="memory sampling period")
    parser.add_argument("--pss", action="store_true", help="also sample PSS (smaps_rollup; costlier)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="then SIGINT (warm stop)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args()

    argv = [
        sys.executable,
        "-m",
        "rlmq.cli",
        "up",
        "--actors",
        str(args.actors),
        "--learners",
        str(args.learners),
        "--env",
        args.env,
        "--total-steps",
        str(args.total_steps),
        "--run-dir",
        str(args.run_dir),
    ]
    args.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.run_dir.parent / f"{args.run_dir.name}.log"
    print(" ".join(argv[1:]), f"(output: {log_path})", flush=True)
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    sampler = Sampler(proc.pid, args.pss)
    interrupted = False
    while proc.poll() is None:
        sampler.sample()
        if not interrupted and time.perf_counter() - started > args.timeout_s:
            proc.send_signal(signal.SIGINT)
            interrupted = True
        time.sleep(args.interval_s)
    wall = time.perf_counter() - started
    summary_path = args.run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    result = report(sampler, summary, proc.returncode, wall, args.pss, args.run_dir)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result["command"] = argv[1:]
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
