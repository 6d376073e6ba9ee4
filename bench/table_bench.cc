// The sparse table's own speed, with no network: EmbeddingTable::Push and Pull of --keys
// distinct random keys from a key space of --key_space (rows created by a warm-up), Adagrad as
// in bench/ps.sh, with an apply pool of --threads threads (0: the calling thread only). Prints
// ns per key and MB/s of rows for each, the figure bench/ps.sh's sparse rows are bounded by
// when the wire is not.
//
//   bazel run -c opt //bench:table_bench -- --keys 100000 --key_space 1000000 --threads 2

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/thread_pool.h"
#include "gflags/gflags.h"
#include "proto/model.pb.h"
#include "ps_server/embedding_table.h"

DEFINE_int64(keys, 100000, "Distinct keys per push or pull.");
DEFINE_int64(key_space, 1000000, "Keys are drawn from [0, key_space).");
DEFINE_int32(dim, 8, "Floats per row.");
DEFINE_int32(threads, 2, "Apply pool threads (0: the calling thread only).");
DEFINE_int32(rounds, 30, "Timed pushes and pulls.");

namespace pscluster {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run() {
  v1::TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(FLAGS_dim);
  spec.mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  spec.mutable_initializer()->set_min(-0.05f);
  spec.mutable_initializer()->set_max(0.05f);
  spec.mutable_initializer()->set_seed(7);
  spec.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.05f);
  spec.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator_value(0.1f);
  constexpr int32_t kVirtualShards = 64;
  std::vector<int32_t> all(kVirtualShards);
  std::iota(all.begin(), all.end(), 0);
  auto table = EmbeddingTable::Create(spec, all, kVirtualShards);
  if (!table.ok()) {
    std::fprintf(stderr, "table_bench: %s\n", table.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(FLAGS_threads);

  const int64_t n = FLAGS_keys;
  const int64_t dim = FLAGS_dim;
  std::vector<int64_t> space(static_cast<size_t>(FLAGS_key_space));
  std::iota(space.begin(), space.end(), 0);
  std::vector<float> out(static_cast<size_t>(n * dim));
  // Warm-up: every key of the space gets its row.
  for (int64_t begin = 0; begin < FLAGS_key_space; begin += n) {
    const int64_t count = std::min(n, FLAGS_key_space - begin);
    absl::Status s = (*table)->Pull(space.data() + begin, count, out.data(), pool.get());
    if (!s.ok()) {
      std::fprintf(stderr, "table_bench: warm-up: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::mt19937_64 rng(1);
  std::vector<float> grads(static_cast<size_t>(n * dim));
  std::uniform_real_distribution<float> grad(-0.01f, 0.01f);
  for (float& g : grads) g = grad(rng);
  std::vector<double> push_ns, pull_ns;
  for (int r = 0; r < FLAGS_rounds; ++r) {
    // A fresh random subset each round, as ps_bench draws them.
    for (int64_t i = 0; i < n; ++i) {
      std::swap(
          space[static_cast<size_t>(i)],
          space[static_cast<size_t>(i + static_cast<int64_t>(rng() % (FLAGS_key_space - i)))]);
    }
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = (*table)->Push(space.data(), n, grads.data(), false, pool.get());
    auto t1 = std::chrono::steady_clock::now();
    absl::Status p = (*table)->Pull(space.data(), n, out.data(), pool.get());
    auto t2 = std::chrono::steady_clock::now();
    if (!s.ok() || !p.ok()) {
      std::fprintf(stderr, "table_bench: %s %s\n", s.ToString().c_str(), p.ToString().c_str());
      return 1;
    }
    push_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
    pull_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / n);
  }
  const double row_bytes = static_cast<double>(dim) * sizeof(float);
  for (const auto& [name, v] :
       {std::pair<const char*, std::vector<double>&>{"push", push_ns}, {"pull", pull_ns}}) {
    const double ns = Median(v);
    std::printf(
        "BENCH table_%s_%lldx%lld_%dthreads %.1f ns/key = %.0f MB/s of rows (%.1f Mkeys/s)\n", name,
        static_cast<long long>(n), static_cast<long long>(dim), FLAGS_threads, ns,
        row_bytes / ns * 1e3, 1e3 / ns);
  }
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return pscluster::Run();
}
