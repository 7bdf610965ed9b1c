"""Build of the gdnconv extension: one module, the Cython layer plus the C kernels.

No -march flags: ISA kernels select their instructions with target pragmas and are
chosen at run time, so one wheel runs on every x86-64 CPU. OpenMP is required: the
build stops when the compiler cannot build and link an OpenMP program with this
build's flags (CFLAGS and LDFLAGS included); GDNCONV_NO_OPENMP=1 builds a
single-threaded kernel instead.
"""
import glob
import os
import shlex
import sys
import tempfile
import warnings

# GDNCONV_OPT_FLAGS replaces them (scripts/sanitize.sh builds with -O1: ASan+UBSan
# at -O3 took over 15 minutes for one kernel file on the 2-core VM)
OPT_FLAGS = shlex.split(os.environ.get("GDNCONV_OPT_FLAGS", "")) or [
    "-O3", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
SOURCES = ["src/gdnconv/_core.pyx"] + [
    f"src/csrc/{name}.c"
    for name in ("cpu_features", "cpu_x86", "cpu_aarch64", "isa", "threads", "update", "update_scalar",
                 "update_avx2", "update_avx512", "update_avx512bf16", "prefill", "prefill_scalar", "prefill_avx2",
                 "prefill_avx512", "prefill_avx512bf16", "update_neon", "update_neonbf16", "prefill_neon",
                 "prefill_neonbf16", "memory", "torch_op")
]


def _probe_openmp(compiler, flags):
    """None if a small OpenMP program compiles and links with these flags, else the error.
    The compile step already carries CFLAGS (setuptools puts them into the compiler
    command); the link step gets them with LDFLAGS here, as the extension's link does,
    so that flags such as -fsanitize=address reach both."""
    msvc = compiler.compiler_type == "msvc"
    env = [] if msvc else shlex.split(os.environ.get("CFLAGS", "")) + shlex.split(os.environ.get("LDFLAGS", ""))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        try:
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=flags)
            compiler.link_executable(objs, os.path.join(tmp, "omp"), extra_postargs=flags + env)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
    return None


def openmp_flags(compiler, build_flags):
    """OpenMP compile and link flags for this compiler, checked with build_flags plus
    CFLAGS/LDFLAGS; [] with GDNCONV_NO_OPENMP=1. Raises RuntimeError when OpenMP was
    requested (the default) but does not work."""
    if os.environ.get("GDNCONV_NO_OPENMP", "").strip() not in ("", "0"):
        warnings.warn("gdnconv: GDNCONV_NO_OPENMP is set; building a single-threaded kernel")
        print("*" * 72 + "\n* gdnconv: built WITHOUT OpenMP (GDNCONV_NO_OPENMP): kernels run "
              "single-threaded\n" + "*" * 72, file=sys.stderr)
        return []
    omp = ["/openmp"] if compiler.compiler_type == "msvc" else ["-fopenmp"]
    error = _probe_openmp(compiler, build_flags + omp)
    if error:
        raise RuntimeError(
            f"gdnconv: OpenMP does not work with this compiler ({' '.join(compiler.compiler_so)}) and flags "
            f"{build_flags + omp} (CFLAGS={os.environ.get('CFLAGS', '')!r}, "
            f"LDFLAGS={os.environ.get('LDFLAGS', '')!r}): {error}. Install the compiler's OpenMP "
            f"runtime (libgomp for GCC, libomp for clang) or set GDNCONV_NO_OPENMP=1 to build a "
            f"single-threaded kernel.")
    return omp


def compile_side_by_side(compiler, jobs):
    """Make compiler.compile (a unix compiler's: distutils' CCompiler.compile, which
    compiles one source after another) compile up to ``jobs`` sources at once, each with
    distutils' own per-source step (_compile), so flags, the dependency check and errors
    stay distutils'. (build_ext's --parallel runs extensions side by side, not one
    extension's sources.) On the 2-core VM: 213 s against 400 s one after another, the
    two AVX-512 update kernels taking 187 s and 108 s of it."""
    from concurrent.futures import ThreadPoolExecutor

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            for done in [pool.submit(one, obj) for obj in objects if obj in build]:
                done.result()     # (raises the first failure, CompileError, after the rest finish)
        return objects

    compiler.compile = compile


def build_jobs(parallel):
    """Sources compiled at once: build_ext's --parallel / -j N when given, else
    GDNCONV_BUILD_JOBS, else the CPUs this process may run on."""
    if parallel:
        return (os.cpu_count() or 1) if parallel is True else int(parallel)
    env = os.environ.get("GDNCONV_BUILD_JOBS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"GDNCONV_BUILD_JOBS={env!r} is not a positive integer: set it to the number of "
                             f"sources to compile at once (e.g. GDNCONV_BUILD_JOBS=2), or unset it to use every CPU")
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    import numpy as np
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    from setuptools.command.build_ext import build_ext

    class BuildExt(build_ext):
        def build_extensions(self):
            msvc = self.compiler.compiler_type == "msvc"
            opt = ["/O2"] if msvc else OPT_FLAGS
            omp = openmp_flags(self.compiler, opt)
            # release builds carry no debug info (Python's CFLAGS have -g); GDNCONV_DEBUG=1 keeps it
            nodebug = [] if msvc or os.environ.get("GDNCONV_DEBUG") == "1" else ["-g0"]
            for ext in self.extensions:
                ext.extra_compile_args = opt + omp + nodebug
                ext.extra_link_args = [] if msvc else omp
            if self.compiler.compiler_type == "unix":   # (MSVC's compile is its own)
                compile_side_by_side(self.compiler, build_jobs(self.parallel))
            super().build_extensions()

    ext = Extension(
        "gdnconv._core",
        sources=SOURCES,
        include_dirs=["include", "src/csrc", np.get_include()],
        depends=glob.glob("src/csrc/*.h") + glob.glob("include/gdnconv/*.h") + glob.glob("src/gdnconv/*.pxi"),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        libraries=["dl"] if sys.platform.startswith("linux") else [],   # (torch_op.c's dlopen; glibc < 2.34)
    )

    setup(
        ext_modules=cythonize([ext], include_path=["src"], compiler_directives={"language_level": 3}),
        cmdclass={"build_ext": BuildExt},
    )
