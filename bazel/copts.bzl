"""Compiler options shared by BUILD files."""

# For the element-wise loops that run over every parameter or gradient element on the ps
# (optimizer updates, the NaN/Inf scan, accumulator sums, wire decoding): -O3 lets GCC
# vectorize them, which -O2's cost model does not. Without -ffast-math the results are the same
# bit for bit (each element is computed alone; SSE sqrt and division are correctly rounded), so
# partitioning and tests are unaffected.
#
# -fno-math-errno lets sqrt vectorize (nothing reads errno); -ffp-contract=off keeps a*b+c two
# rounded operations on every target, so the AVX2 and baseline versions of a loop
# (ps_server/optimizer.cc) agree bit for bit.
HOT_LOOP_COPTS = ["-O3", "-fno-math-errno", "-ffp-contract=off"]
