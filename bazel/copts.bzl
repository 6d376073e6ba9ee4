"""Compiler options shared by BUILD files."""

# For the element-wise loops that run over every parameter or gradient element on the ps
# (optimizer updates, the NaN/Inf scan, accumulator sums, wire decoding): -O3 lets GCC
# vectorize them, which -O2's cost model does not. Without -ffast-math the results are the same
# bit for bit (each element is computed alone; SSE sqrt and division are correctly rounded), so
# partitioning and tests are unaffected.
HOT_LOOP_COPTS = ["-O3"]
