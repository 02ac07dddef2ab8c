"""Build of the two C extensions; everything else about the package is in setup.cfg.

scale0.net._zmqio (whole-message receive and batched send on pyzmq's libzmq, see its source)
(with the lane, scale0/net/_lane.c: a C thread that owns the broker's ROUTERs and answers
plain HEARTBEATs, docs/architecture.md) is optional: without a C compiler the install still succeeds and scale0.net.frames_io uses
pyzmq's per-frame calls instead (slower, same behaviour; docs/performance.md).

scale0.core._pool (the worker pool in C, held to scale0.core.workers.WorkerPool by
tests/core/test_pool_parity.py) is optional too: where it is built, the broker's ledger keeps its
worker pool in it (scale0.core.ledger, SCALE0_POOL); without it, in WorkerPool. Phase 2 of the
C lane (docs/architecture.md, "Decided, being built").
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "scale0.net._zmqio",
            ["scale0/net/_zmqio.c", "scale0/net/_lane.c"],
            depends=["scale0/net/_zmqio.h", "scale0/_table.h", "scale0/core/_pool_api.h"],
            libraries=["dl", "pthread"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        ),
        Extension(
            "scale0.core._pool",
            ["scale0/core/_pool.c"],
            depends=["scale0/_table.h", "scale0/core/_pool_api.h"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        ),
    ]
)
