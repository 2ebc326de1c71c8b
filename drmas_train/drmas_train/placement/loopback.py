"""A local Ray that listens on loopback only.

`ray.init()` without an address starts a one-machine cluster whose processes (GCS, raylet, workers, the
runtime-env agent) bind their ports to every interface, so that other machines could join it: anyone
who can reach the machine can reach them. A run that starts its own Ray needs none of that. Ray has a
one-machine mode, its default on macOS and Windows, in which the node's address is 127.0.0.1 and every
one of its processes binds to loopback; `loopback_only` switches it on while `ray.init` starts the
local cluster. Joining a cluster on purpose (`placement.ray_address`) leaves Ray as its operator set it up.

Ray reads the switch (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`) from the environment when it is imported: the
processes `ray.init` starts inherit the variable, and in this process, which may have imported Ray
already, the constant it was read into is set for the call. `tests/train/test_ray_loopback.py` lists
the listening sockets of a placed run to check that nothing else listens.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ONE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch: "0" makes a local Ray a one-machine cluster on 127.0.0.1."""


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While it is open, a `ray.init()` without an address starts a Ray that listens on 127.0.0.1 only."""
    from ray._private import ray_constants

    saved_env, saved_flag = os.environ.get(ONE_MACHINE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ONE_MACHINE_ENV] = "0"  # read by the GCS, the raylet and the workers it starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # read by this process's ray.init, imported before now
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(ONE_MACHINE_ENV, None)
        else:
            os.environ[ONE_MACHINE_ENV] = saved_env
