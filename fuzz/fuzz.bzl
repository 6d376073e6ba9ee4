"""ps_fuzzer: a libFuzzer target that also builds, without --config=fuzz, as a plain binary."""

def ps_fuzzer(name, srcs, deps = [], testonly = False):
    """A fuzz target `name` from srcs that define LLVMFuzzerTestOneInput.

    With --config=fuzz (--define=fuzz=1) it links libFuzzer; otherwise it links
    :standalone_main, a main() that runs LLVMFuzzerTestOneInput once over each file (or each
    file of each directory) named on the command line, so `bazel build //...` builds it with
    any compiler and :corpus_test can replay the corpus and the regressions with it.
    """
    native.cc_binary(
        name = name,
        testonly = testonly,
        srcs = srcs,
        deps = deps + [":fuzz_util"] + select({
            ":fuzz_enabled": [],
            "//conditions:default": [":standalone_main"],
        }),
        linkopts = select({
            ":fuzz_enabled": ["-fsanitize=fuzzer,address,undefined"],
            "//conditions:default": [],
        }),
    )
