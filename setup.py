"""Build of the gdnconv extension: one module, the Cython layer plus the C kernels.

No -march flags: ISA kernels select their instructions with target pragmas and are
chosen at run time, so one wheel runs on every x86-64 CPU. OpenMP is used when the
compiler supports it; without it the build warns loudly and the kernel runs on the
calling thread.
"""
import glob
import os
import sys
import tempfile
import warnings

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = ["src/gdnconv/_core.pyx"] + [
    f"src/csrc/{name}.c"
    for name in ("cpu_features", "cpu_x86", "cpu_aarch64", "isa", "threads", "update", "update_scalar",
                 "update_avx2", "update_avx512", "update_avx512bf16")
]


def _compiles_with(compiler, flags):
    """True if a tiny OpenMP program compiles and links with these flags."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        try:
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=flags)
            compiler.link_executable(objs, os.path.join(tmp, "omp"), extra_postargs=flags)
            return True
        except Exception:
            return False


class BuildExt(build_ext):
    def build_extensions(self):
        msvc = self.compiler.compiler_type == "msvc"
        opt = ["/O2"] if msvc else ["-O3", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
        omp = ["/openmp"] if msvc else ["-fopenmp"]
        if os.environ.get("GDNCONV_NO_OPENMP") or not _compiles_with(self.compiler, omp):
            warnings.warn("gdnconv: the compiler has no OpenMP; building a single-threaded kernel")
            print("*" * 72 + "\n* gdnconv: OpenMP NOT available, kernels will run single-threaded\n" + "*" * 72,
                  file=sys.stderr)
            omp = []
        # release builds carry no debug info (Python's CFLAGS have -g); GDNCONV_DEBUG=1 keeps it
        nodebug = [] if msvc or os.environ.get("GDNCONV_DEBUG") == "1" else ["-g0"]
        for ext in self.extensions:
            ext.extra_compile_args = opt + omp + nodebug
            ext.extra_link_args = [] if msvc else omp
        super().build_extensions()


ext = Extension(
    "gdnconv._core",
    sources=SOURCES,
    include_dirs=["include", "src/csrc", np.get_include()],
    depends=glob.glob("src/csrc/*.h") + glob.glob("include/gdnconv/*.h") + glob.glob("src/gdnconv/*.pxi"),
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(
    ext_modules=cythonize([ext], include_path=["src"], compiler_directives={"language_level": 3}),
    cmdclass={"build_ext": BuildExt},
)
