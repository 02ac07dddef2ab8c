"""Build of the one C extension; everything else about the package is in setup.cfg.

scale0.net._zmqio (whole-message receive and batched send on pyzmq's libzmq, see its source)
is optional: without a C compiler the install still succeeds and scale0.net.frames_io uses
pyzmq's per-frame calls instead (slower, same behaviour; docs/performance.md).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "scale0.net._zmqio",
            ["scale0/net/_zmqio.c"],
            libraries=["dl"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
