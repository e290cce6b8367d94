"""The Redis key schema and typed access to it — the only module that names a key.

    rlmq:{run}:config              JSON: the RunConfig and the probed EnvSpec
    rlmq:{run}:status              hash: RunStatus's fields, each JSON (state, env_steps, mean_return, ...)
    rlmq:{run}:members             hash: member → JSON MemberRecord (coordinator/records.py)
    rlmq:{run}:member_steps        hash: member → env steps its actors collected
    rlmq:{run}:pbt                 stream: PBT decisions, entry id "{decision id}-0",
                                   field "decision" (JSON LoggedDecision)
                                   or field "generation" (JSON LoggedGeneration, method "cem"), or
                                   field "diversity" (JSON LoggedDiversityWeight, adaptive "dvd")
    rlmq:{run}:pbt_applied         the id of the last decision applied to the member records
    rlmq:{run}:cem:{id}            hash: the search distribution generation {id} draws from (mean and
                                   variance as raw float64, noise, generation); kept for the last
                                   applied generation and one logged but not yet applied
    rlmq:{run}:weights:{member}    the latest Weights message, encoded as on the wire (never pickle)
    rlmq:{run}:returns:{member}    list: the member's most recent episode returns, newest first
    rlmq:{run}:actors              hash: actor name → last heard (unix seconds)
    rlmq:{run}:reports             hash: actor name → "{session}:{env steps}:{episodes}" counted of its session
    rlmq:{run}:learners            hash: learner rank → JSON LearnerRecord
    rlmq:{run}:progress            list: JSON ProgressSample, oldest first
    rlmq:{run}:tally:{actor}       hash: claimed_/delivered_/counted_ steps and episodes (secure runs)
    rlmq:{run}:deliveries          hash: "{learner session}:{actor}" → "{env steps}:{episodes}" heard
                                   of that learner process's delivered totals (secure runs)

A store made by `RunStore.connect` rides out Redis outages for a budget of seconds (`OutageRetry`):
each service picks its own, since a coordinator should wait and a status line should not.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import redis

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.loading import from_mapping
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.cem import Distribution
from rlmq.coordinator.counting import ADD_DELIVERIES, ADD_REPORT
from rlmq.coordinator.outage import NOT_OUTAGES as NOT_OUTAGES
from rlmq.coordinator.outage import OUTAGE_ERRORS as OUTAGE_ERRORS
from rlmq.coordinator.outage import OutageRetry
from rlmq.coordinator.records import (
    STATUS_FIELDS,
    LearnerRecord,
    LoggedDecision,
    LoggedDiversityWeight,
    LoggedGeneration,
    MemberRecord,
    ProgressSample,
    RunStatus,
    from_json,
    to_json,
)

RECENT_EPISODES = 100
PROGRESS_SAMPLES = 100_000


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

log = logging.getLogger("rlmq.store")

# KEYS: the decisions' stream, the generation's distribution. ARGV: the entry's id and JSON, then the
# distribution's mean, variance, noise and generation. Returns 1, or 0 if the id is logged already.
LOG_GENERATION = """
local logged = redis.pcall('XADD', KEYS[1], ARGV[1], 'generation', ARGV[2])
if type(logged) == 'table' and logged.err then
  if string.find(logged.err, 'equal or smaller') then
    return 0
  end
  return redis.error_reply(logged.err)
end
redis.call('HSET', KEYS[2], 'mean', ARGV[3], 'variance', ARGV[4], 'noise', ARGV[5], 'generation', ARGV[6])
return 1
"""


class ReportCounted(NamedTuple):
    """What one actor report added (`RunStore.add_actor_report`)."""

    steps: int  # env steps counted
    episodes: int  # episodes counted
    run_steps: int  # the run's env steps after it
    recent: list[float]  # the member's recent returns, newest first, if the report pushed any
    uncounted: int  # the name's episodes claimed and not counted yet: the newest of its claims
    steps_uncounted: int = 0  # the name's env steps claimed and not counted yet


class RunStore:
    def __init__(self, client: redis.Redis, run: str) -> None:
        if not RUN_ID.fullmatch(run):  # no ':' or glob characters: keys of one run never match another's
            raise ValueError(f"run id {run!r}: use letters, digits, '_', '.', '-' (at most 128)")
        self.redis, self.run = client, run
        self.prefix = f"rlmq:{run}"

    @classmethod
    def connect(
        cls,
        url: str,
        run: str,
        outage_s: float = 0.0,
        timeout_s: float = 10.0,
        report: Callable[[str], object] | None = log.warning,
        give_up: Callable[[], bool] | None = None,
    ) -> RunStore:
        """A store whose every access rides out a Redis outage of up to `outage_s` seconds (0: one
        try; `give_up()` true: no more tries), with a line to `report` when an outage starts and
        when it ends. `timeout_s` bounds each connect and reply, so a hung server counts as an
        outage too."""
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=OutageRetry(url, outage_s, report, give_up),
        )
        return cls(client, run)

    def ping(self) -> None:
        self.redis.ping()

    def key(self, *parts: object) -> str:
        return ":".join([self.prefix, *map(str, parts)])

    # --- config -------------------------------------------------------------------------------

    def save_config(self, config: RunConfig, spec: EnvSpec) -> None:
        doc = {"run_config": dataclasses.asdict(config), "env_spec": dataclasses.asdict(spec)}
        self.redis.set(self.key("config"), json.dumps(doc, sort_keys=True))

    def load_config(self) -> tuple[RunConfig, EnvSpec] | None:
        raw = self.redis.get(self.key("config"))
        if raw is None:
            return None
        doc = json.loads(raw)
        return from_mapping(RunConfig, doc["run_config"]), from_mapping(EnvSpec, doc["env_spec"])

    # --- status -------------------------------------------------------------------------------

    def set_status(self, **fields: Any) -> None:
        """Write these fields of the run's status (RunStatus names them all)."""
        unknown = set(fields) - STATUS_FIELDS
        if unknown:
            raise TypeError(f"RunStatus has no field {', '.join(sorted(unknown))}")
        self.redis.hset(self.key("status"), mapping={k: json.dumps(v) for k, v in fields.items()})

    def status(self) -> RunStatus:
        raw = self.redis.hgetall(self.key("status"))
        return from_mapping(RunStatus, {_text(k): json.loads(v) for k, v in raw.items()})

    def append_progress(self, sample: ProgressSample) -> None:
        pipe = self.redis.pipeline()
        pipe.rpush(self.key("progress"), to_json(sample))
        pipe.ltrim(self.key("progress"), -PROGRESS_SAMPLES, -1)
        pipe.execute()

    def progress(self, start: int = 0) -> list[ProgressSample]:
        """The progress samples from index `start` on (negative: that many from the end)."""
        return [from_json(ProgressSample, s) for s in self.redis.lrange(self.key("progress"), start, -1)]

    # --- members, episodes, weights -----------------------------------------------------------

    def add_actor_report(
        self,
        actor: str,
        member: int,
        env_steps: int,
        returns: list[float | None],
        session: int = 0,
        steps_total: int = 0,
        episodes_total: int = 0,
        checked: bool = False,
    ) -> ReportCounted:
        """Record one actor report in one round trip (64 actors report several times a second):
        the actor's liveness, its env steps and finished episodes.

        One Lua script, so Redis applies all of it or none. With a `session`, what is counted is
        what the session's totals add to those counted before (`returns` are the last of its
        episodes): a report repeated after a coordinator's restart, overtaken by a later one, or
        retried after a reply lost in an outage adds nothing twice. Without one, `env_steps` and
        `returns` are added as they are. `checked` (a secure run): the actor's claims, added up
        over all its sessions, count no further than the learners have taken its rollouts
        (`add_deliveries`); what is not yet covered counts at a later report of the same name, in
        the order claimed. The member's record gets the returns of the episodes counted, as far as
        the report carries them, but those given as None (counted, not evidence of its weights);
        the actor sends those of the `uncounted` again."""
        steps_added, episodes_added, steps, recent, uncounted, steps_uncounted = self.redis.eval(
            ADD_REPORT,
            6,
            self.key("actors"),
            self.key("status"),
            self.key("member_steps"),
            self.key("returns", member),
            self.key("reports"),
            self.key("tally", actor),
            actor,
            time.time(),
            member,
            env_steps,
            session,
            steps_total,
            episodes_total,
            RECENT_EPISODES,
            int(checked),
            *("-" if r is None else r for r in returns),
        )
        return ReportCounted(
            int(steps_added),
            int(episodes_added),
            int(steps),
            [float(v) for v in recent],
            int(uncounted),
            int(steps_uncounted),
        )

    def add_deliveries(self, session: int, steps: dict[str, int], episodes: dict[str, int]) -> None:
        """The env steps and episode ends a learner process (`session`) took in each actor's
        rollouts, as totals: what `add_actor_report(checked=True)` counts an actor's claims
        against. Each name's tally grows by what its totals add to the last heard of the session,
        so a report lost, repeated or overtaken adds nothing twice and leaves nothing out."""
        names = sorted(steps.keys() | episodes.keys())
        if names:
            self.redis.eval(
                ADD_DELIVERIES,
                1 + len(names),
                self.key("deliveries"),
                *(self.key("tally", name) for name in names),
                session,
                *(v for name in names for v in (name, steps.get(name, 0), episodes.get(name, 0))),
            )

    def tally(self, actor: str) -> dict[str, int]:
        """An actor's tally (a secure run): claimed_/delivered_/counted_ steps and episodes."""
        return {_text(k): int(v) for k, v in self.redis.hgetall(self.key("tally", actor)).items()}

    def uncounted_deliveries(self, actors: list[str]) -> int:
        """Env steps the learners took from these actors that no report has counted yet: what
        their next reports would count (a secure run)."""
        pipe = self.redis.pipeline(transaction=False)
        for actor in actors:
            pipe.hmget(self.key("tally", actor), "delivered_steps", "counted_steps")
        return sum(max(int(d or 0) - int(k or 0), 0) for d, k in pipe.execute())

    def recent_returns(self, member: int) -> list[float]:
        return [float(v) for v in self.redis.lrange(self.key("returns", member), 0, -1)]

    def clear_returns(self, member: int) -> None:
        self.redis.delete(self.key("returns", member))

    def put_members(self, records: dict[int, MemberRecord]) -> None:
        self.redis.hset(self.key("members"), mapping={str(m): to_json(r) for m, r in records.items()})

    def members(self) -> dict[int, MemberRecord]:
        raw = self.redis.hgetall(self.key("members"))
        return {int(k): from_json(MemberRecord, v) for k, v in sorted(raw.items(), key=lambda kv: int(kv[0]))}

    def member_steps(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.redis.hgetall(self.key("member_steps")).items()}

    # --- the decisions' log: PBT decisions, CEM-RL generations, DvD's weights -----------------

    def append_decision(self, entry: LoggedDecision | LoggedDiversityWeight) -> bool:
        """Log a PBT decision or a DvD weight under its own id; False if that id is logged already
        (so appending the same decision twice, e.g. around a crash, cannot log it twice)."""
        field = "decision" if isinstance(entry, LoggedDecision) else "diversity"
        try:
            self.redis.xadd(self.key("pbt"), {field: to_json(entry)}, id=f"{entry.id}-0")
        except redis.ResponseError as exc:
            if "equal or smaller" in str(exc):
                return False
            raise
        return True

    def decisions(self, after: int = 0) -> list[LoggedDecision]:
        """Logged PBT decisions with id > `after`, in order."""
        return [from_json(LoggedDecision, text) for text in self._logged(b"decision", after)]

    def last_decisions(self, count: int) -> list[LoggedDecision]:
        """The newest `count` logged decisions, oldest first (no read of the whole log)."""
        return [from_json(LoggedDecision, text) for text in self._last_logged(b"decision", count)]

    def diversity_weights(self, after: int = 0) -> list[LoggedDiversityWeight]:
        """DvD's logged weights with id > `after`, in order."""
        return [from_json(LoggedDiversityWeight, text) for text in self._logged(b"diversity", after)]

    def last_diversity_weights(self, count: int) -> list[LoggedDiversityWeight]:
        return [from_json(LoggedDiversityWeight, text) for text in self._last_logged(b"diversity", count)]

    def _logged(self, field: bytes, after: int) -> list[bytes | str]:
        """The `field` of each entry with id > `after` that has it (one stream holds every method's)."""
        entries = self.redis.xrange(self.key("pbt"), min=f"({after}-0" if after else "-", max="+") or []
        return [fields[field] for _id, fields in entries if fields and field in fields]

    def _last_logged(self, field: bytes, count: int) -> list[bytes | str]:
        """The `field` of the newest `count` entries that have it, oldest first (no read of the
        whole log, but of the newest `count` entries)."""
        entries = self.redis.xrevrange(self.key("pbt"), max="+", min="-", count=count) or []
        return [fields[field] for _id, fields in reversed(entries) if fields and field in fields]

    def applied_decision(self) -> int:
        return int(self.redis.get(self.key("pbt_applied")) or 0)

    def apply_decision(self, decision_id: int, target: int, record: MemberRecord, copied: bool) -> None:
        """One transaction: the target's new record, the applied id, and (after a copy) its old
        returns dropped — they were earned by weights it no longer has."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key("members"), str(target), to_json(record))
        pipe.set(self.key("pbt_applied"), decision_id)
        if copied:
            pipe.delete(self.key("returns", target))
        pipe.execute()

    # --- CEM-RL's generations: the same log and applied id ----------------------------------

    def append_generation(self, entry: LoggedGeneration, drawn_from: Distribution) -> bool:
        """Log a generation with the distribution it draws from, both or neither (a script); False
        if its id is logged already."""
        logged = self.redis.eval(
            LOG_GENERATION,
            2,
            self.key("pbt"),
            self.key("cem", entry.id),
            f"{entry.id}-0",
            to_json(entry),
            drawn_from.mean.astype("<f8").tobytes(),
            drawn_from.variance.astype("<f8").tobytes(),
            repr(drawn_from.noise),
            drawn_from.generation,
        )
        return bool(logged)

    def generations(self, after: int = 0) -> list[LoggedGeneration]:
        """Logged generations with id > `after`, in order."""
        return [from_json(LoggedGeneration, text) for text in self._logged(b"generation", after)]

    def last_generations(self, count: int) -> list[LoggedGeneration]:
        """The newest `count` logged generations, oldest first."""
        return [from_json(LoggedGeneration, text) for text in self._last_logged(b"generation", count)]

    def distribution(self, generation_id: int) -> Distribution | None:
        """The distribution logged with generation `generation_id`, checked as it is read."""
        key = self.key("cem", generation_id)
        raw = self.redis.hgetall(key)
        if not raw:
            return None
        mean, variance = raw.get(b"mean", b""), raw.get(b"variance", b"")
        if not (isinstance(mean, bytes) and isinstance(variance, bytes)):
            raise ValueError(f"{key}: mean and variance must be bytes")
        if not mean or len(mean) != len(variance) or len(mean) % 8:
            raise ValueError(f"{key}: mean and variance are not float64 vectors of one length")
        dist = Distribution(
            np.frombuffer(mean, "<f8").copy(),
            np.frombuffer(variance, "<f8").copy(),
            float(raw[b"noise"]),
            int(raw[b"generation"]),
        )
        if not (np.isfinite(dist.mean).all() and np.isfinite(dist.variance).all() and dist.variance.min() >= 0):
            raise ValueError(f"{key}: not finite, or a negative variance")
        return dist

    def apply_diversity_weight(self, decision_id: int) -> None:
        """DvD's weight changes no member record: applying it is recording its id applied."""
        self.redis.set(self.key("pbt_applied"), decision_id)

    def apply_generation(self, entry: LoggedGeneration, records: dict[int, MemberRecord], previous: int) -> None:
        """One transaction: every member's record, the applied id, the members' returns dropped
        (earned by actors they no longer have) and the distribution of generation `previous`."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key("members"), mapping={str(m): to_json(r) for m, r in records.items()})
        pipe.set(self.key("pbt_applied"), entry.id)
        pipe.delete(*(self.key("returns", m) for m in records))
        if previous:
            pipe.delete(self.key("cem", previous))
        pipe.execute()

    def put_encoded_weights(self, member: int, encoded: bytes) -> None:
        """Store a Weights message exactly as it arrived (already validated by `wire.decode`)."""
        self.redis.set(self.key("weights", member), encoded)

    def weights(self, member: int) -> wire.Weights | None:
        encoded = self.redis.get(self.key("weights", member))
        if encoded is None:
            return None
        if not isinstance(encoded, bytes):
            raise wire.WireError("bad_type", "weights key holds text, not an encoded message")
        message = wire.decode(encoded)  # Redis is not trusted more than the wire
        if not isinstance(message, wire.Weights):
            raise wire.WireError("unexpected_kind", f"weights key holds {type(message).__name__}")
        return message

    # --- liveness -----------------------------------------------------------------------------

    def touch_actor(self, name: str) -> None:
        self.redis.hset(self.key("actors"), name, time.time())

    def live_actors(self, timeout_s: float, forget_after_s: float | None = None) -> int:
        """Actors heard from within `timeout_s`; those silent for `forget_after_s` are deleted (a
        fleet replaces pods with new names, and a fuzzer invents names: the hash stays bounded)."""
        now = time.time()
        seen = self.redis.hgetall(self.key("actors"))
        if forget_after_s is not None:
            gone = [name for name, t in seen.items() if now - float(t) > forget_after_s]
            if gone:
                self.redis.hdel(self.key("actors"), *gone)
        return sum(1 for t in seen.values() if now - float(t) < timeout_s)

    def put_learner(self, rank: int, record: LearnerRecord) -> None:
        self.redis.hset(self.key("learners"), str(rank), to_json(record))

    def learners(self) -> dict[int, LearnerRecord]:
        raw = self.redis.hgetall(self.key("learners"))
        return {int(k): from_json(LearnerRecord, v) for k, v in raw.items()}

    def reopen(self, config: RunConfig) -> bool:
        """Continue a run that ended or was stopped: its config takes `config` (a new budget or
        target), its status says running and forgets how it ended, and when its actors first stepped
        (the wall times of summary.json are each session's). False if there is no such run."""
        saved = self.load_config()
        if saved is None:
            return False
        self.save_config(config, saved[1])
        self.redis.hdel(
            self.key("status"),
            "reason",
            "detail",
            "success",
            "ended_at",
            "finished_at",
            "env_steps_at_end",
            "first_step_at",
        )
        self.set_status(state="running")
        return True

    def delete_run(self) -> None:
        keys = list(self.redis.scan_iter(match=f"{self.prefix}:*"))
        if keys:
            self.redis.delete(*keys)
