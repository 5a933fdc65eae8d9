"""CUDA compilation with the toolkit's nvcc through a genrule (offline, Bazel 4.2.3).

`cuda_library` compiles each .cu source to an object file for Hopper (sm_90 machine code plus
compute_90 PTX, so newer chips can JIT it) and wraps the objects in a cc_library that links the
static CUDA runtime. It needs nvcc, not a GPU: CI builds it on machines without one.

A .cu file should include only its own small headers and CUDA's: nvcc parses it with the host
compiler, and keeping Abseil and the project's C++ away from nvcc keeps the build simple and fast.
Sources are compiled from the workspace root, so includes are workspace-relative ("gpu/x.h").

Without a toolkit (tools/cuda_configure.bzl) every cuda_library, and every target that depends on
one, is incompatible: `//...` leaves them out. `if_cuda` picks between a CUDA and a host-only
choice for the targets that are built either way (tuttid, the client library).
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_ONLY", "NVCC")

def if_cuda(with_cuda, without_cuda = []):
    """`with_cuda` when the build has the CUDA toolkit, else `without_cuda`."""
    return with_cuda if CUDA_AVAILABLE else without_cuda

NVCC_FLAGS = [
    "-c",
    "-O3",
    "-std=c++17",
    "-Xcompiler",
    "-fPIC",
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
    # Objects go into a cc_library; relocatable device code is not needed (no cross-file
    # device calls), so each object is a complete fatbinary.
]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], driver_api = False, **kwargs):
    """A cc_library `name` over the objects of the .cu `srcs`.

    Args:
      name: the cc_library's name.
      srcs: .cu files; each becomes <name>_<file>.o.
      hdrs: headers the .cu files include and that dependents include.
      deps: cc_library dependencies (their headers are visible to dependents, not to nvcc).
      copts: extra nvcc flags.
      driver_api: link the driver API stub (-lcuda). Prefer resolving driver functions at run
        time (gpu/driver_api.h): a binary linked with the stub does not start without a driver.
      **kwargs: passed to the cc_library (visibility, tags, testonly).
    """
    objs = []
    for src in srcs:
        base = src.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        obj = "%s_%s.o" % (name, base)
        native.genrule(
            name = "%s_%s_nvcc" % (name, base),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = " ".join([NVCC] + NVCC_FLAGS + copts + [
                "-I.",
                "-I$(GENDIR)",
                "-o $@",
                "$(location %s)" % src,
            ]),
            message = "nvcc %s" % src,
            tags = kwargs.get("tags", []),
            testonly = kwargs.get("testonly", False),
            target_compatible_with = CUDA_ONLY,
        )
        objs.append(obj)
    cuda_deps = ["@cuda//:cudart_static"]
    if driver_api:
        cuda_deps.append("@cuda//:cuda_driver")
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + cuda_deps,
        # The objects hold kernels registered by static constructors: keep them even when no
        # symbol of theirs is referenced directly.
        alwayslink = True,
        # Static only: cudart_static is an archive, which a shared object per library (Bazel's
        # default for tests) would leave unresolved.
        linkstatic = True,
        **kwargs
    )
