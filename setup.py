"""Build of the one compiled module, the decoder's fast path; everything else is in pyproject.toml.

Cython (a build requirement, see pyproject.toml) turns applier/codec/_fastpath.pyx into C under
build/, which the C compiler then builds; `pip install -e .` places the module next to the source.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("applier.codec._fastpath", ["applier/codec/_fastpath.pyx"])],
        build_dir="build",
    )
)
