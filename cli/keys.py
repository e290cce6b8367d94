"""`rlmq keys`: a run's CURVE keys (common/security.py) for a cluster, and with `--kubernetes` the
Secrets that deploy/k8s mounts: a kustomization beside the keys, and the Redis password.

Each Secret holds what one kind of pod needs and nothing more:

    rlmq-keys-server     server.key_secret, allowed.json     coordinator, learners (they serve)
    rlmq-keys-learners   learner-<rank>.key_secret           learners
    rlmq-keys-actors     server.key, actors.key_secret       actors (the fleet's key: a Deployment's
                                                             pods are named at random)
    rlmq-redis           redis.conf, redis-password          Redis (the config that requires the
                                                             password), coordinator (the password)

kustomize appends a hash of the contents to each Secret's name, so applying new keys rolls every
pod that mounts them: that is how keys are rotated on Kubernetes.

Without Kubernetes, `bundles/<process>/` holds what one process reads (`security.key_files`), the
`--keys` directory to copy to the host that runs it: `coordinator`, `learner-<rank>`,
`actor-<i>`. Processes on one host may share a directory: the bundles never disagree.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlmq.cli.redis_server import write_redis_password
from rlmq.common.security import ALLOWED_FILE, FLEET, SERVER, create_keys, key_files

REDIS_CONFIG, REDIS_PASSWORD = "redis.conf", "redis-password"
KUSTOMIZATION = """\
# Made by `rlmq keys --kubernetes`: this run's keys and Redis password as the Secrets deploy/k8s
# mounts (cli/keys.py says which pod gets which). Secret: never commit this directory.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
generatorOptions:
  labels:
    app.kubernetes.io/part-of: rlmq
secretGenerator:
{secrets}"""


def secret_files(learners: int) -> dict[str, list[str]]:
    """Each Secret's files (its data keys), by Secret name."""
    return {
        "rlmq-keys-server": [f"{SERVER}.key_secret", ALLOWED_FILE],
        "rlmq-keys-learners": [f"learner-{rank}.key_secret" for rank in range(learners)],
        "rlmq-keys-actors": [f"{SERVER}.key", f"{FLEET}.key_secret"],
        "rlmq-redis": [REDIS_CONFIG, REDIS_PASSWORD],
    }


def make_keys(directory: Path, learners: int, actors: int, kubernetes: bool) -> None:
    """The run's keys in `directory` (which must be empty or absent: keys are made once per run);
    with `kubernetes`, the fleet's actor key, a Redis password and the Secrets' kustomization too."""
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(
            f"{directory} is not empty: keys are made once per run; choose another directory "
            "(rotating keys: make a new set, then restart the run's processes with it)"
        )
    create_keys(directory, learners, actors, fleet=kubernetes)
    write_bundles(directory, learners, actors)
    if kubernetes:
        write_redis_password(directory / REDIS_CONFIG, directory / REDIS_PASSWORD)
        entries = "".join(
            f"  - name: {name}\n    files: [{', '.join(files)}]\n" for name, files in secret_files(learners).items()
        )
        (directory / "kustomization.yaml").write_text(KUSTOMIZATION.format(secrets=entries))


BUNDLES = "bundles"


def write_bundles(directory: Path, learners: int, actors: int) -> None:
    """`directory/bundles/<process>/`: each process's own keys (0700, each file 0600)."""
    processes: dict[str, tuple[str | None, bool]] = {"coordinator": (None, True)}
    processes |= {f"learner-{rank}": (f"learner-{rank}", True) for rank in range(learners)}
    processes |= {f"actor-{i}": (f"actor-{i}", False) for i in range(actors)}
    for process, (name, serves) in processes.items():
        bundle = directory / BUNDLES / process
        bundle.mkdir(parents=True, mode=0o700)
        bundle.parent.chmod(0o700)
        for file in key_files(name, serves):
            fd = os.open(bundle / file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write((directory / file).read_bytes())
