"""Build of the compiled modules, the hot loops; everything else is in pyproject.toml.

- applier/codec/_fastpath.pyx: the decoder's fast path (every record the daemon and the catch-up read);
- applier/catchup/_batch_builder.pyx: the catch-up readers' loop over decoded events;
- sqlgen/_bind.pyx: the values of the daemon's statements turned into SQL text;
- sqlgen/_plan.pyx: the collapse of a keyed table's events into final states (the daemon's planning).

Cython (a build requirement, see pyproject.toml) turns them into C under build/, which the C
compiler then builds; `pip install -e .` places the modules next to their sources.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension("applier.codec._fastpath", ["applier/codec/_fastpath.pyx"]),
            Extension("applier.catchup._batch_builder", ["applier/catchup/_batch_builder.pyx"]),
            Extension("sqlgen._bind", ["sqlgen/_bind.pyx"]),
            Extension("sqlgen._plan", ["sqlgen/_plan.pyx"]),
        ],
        build_dir="build",
    )
)
