"""tutti_fuzz_test: one libFuzzer target, two builds.

Ordinary build: a cc_test that replays the committed corpus (corpus/<name>/) through the target
with regression_main.cc, so `bazel test //...` runs it. With --config=fuzz (clang, libFuzzer,
ASan+UBSan; see .bazelrc) the same target links libFuzzer's main and is the real fuzzer:
bazel-bin/tests/fuzz/<name> tests/fuzz/corpus/<name> -max_total_time=120
"""

def tutti_fuzz_test(name, srcs, deps = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + select({
            "//tests/fuzz:fuzzing": [],
            "//conditions:default": ["//tests/fuzz:regression_main"],
        }),
        linkopts = select({
            "//tests/fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        data = native.glob(["corpus/" + name + "/**"]),
        args = ["tests/fuzz/corpus/" + name],
        **kwargs
    )
