// The sparse table's own speed and memory, with no network.
//
// Speed: EmbeddingTable::Push and Pull of --keys distinct random keys from a key space of
// --key_space (rows created by a warm-up of pushes), Adagrad as in bench/ps.sh, with an apply
// pool of --threads threads (0: the calling thread only). Prints ns per key and MB/s of rows
// for each, the figure bench/ps.sh's sparse rows are bounded by when the wire is not. With
// --compare, the same is measured --trials times for a table without admission and eviction
// and one with both (admission after --min_count pushes, a TTL of a million steps and a
// capacity of twice the key space, so that the bookkeeping is paid and nothing is removed;
// --churn makes the capacity half the key space instead, so that rows are evicted all the
// time; --vocabulary compares a vocabulary table of the key space's ids instead, whose rows are
// found by number), interleaved, with each one's ratio to the plain table of its trial. With
// --occurrences K, a request holds --keys / K distinct keys, each K times in random places (a
// skewed batch, whose repeats the table sums before it updates a row once); ns per key is then
// per key of the request.
//
//   bazel run -c opt //bench:table_bench -- --keys 100000 --key_space 1000000 --threads 2
//   bazel run -c opt //bench:table_bench -- --compare --trials 3
//   bazel run -c opt //bench:table_bench -- --compare --vocabulary --threads 0
//
// Memory (--memory_rows N): pushes N distinct keys into a table of --dim with Adagrad and a
// capacity of --memory_capacity * N rows (eviction.max_rows), and reads the process's resident
// memory before and after: bytes per row against the row's own floats and slots
// ((1 + 1) * dim * 4 bytes); then times a checkpoint's cut of the table (CopyRows), into new
// memory and into memory made before (SAVE_PREPARE), against one contiguous copy of as many
// bytes into new memory; and a marked cut (MarkCut, what a save of a hashed table does): its
// pause, and the rows it keeps aside while its stripes are taken with pushes going on; and how
// long pushes of 4,096 keys take while another thread takes the stripes (each stripe copied
// whole under its lock, in chunks, or in chunks making way for waiting pushes) against no save.
//
//   bazel run -c opt //bench:table_bench -- --memory_rows 10000000 --dim 16

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/huge_page_pool.h"
#include "common/mutex_checks.h"
#include "common/thread_pool.h"
#include "gflags/gflags.h"
#include "proto/model.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/row_index.h"

DEFINE_int64(keys, 100000, "Keys per push or pull (distinct unless --occurrences > 1).");
DEFINE_int32(occurrences, 1, "Times each key of a request occurs in it.");
DEFINE_int64(key_space, 1000000, "Keys are drawn from [0, key_space).");
DEFINE_int32(dim, 8, "Floats per row.");
DEFINE_int32(threads, 2, "Apply pool threads (0: the calling thread only).");
DEFINE_int32(rounds, 30, "Timed pushes and pulls.");
DEFINE_bool(compare, false, "Measure a plain table against one with admission and eviction.");
DEFINE_int32(trials, 3, "--compare: interleaved trials of each table; --memory_rows: of the cut.");
DEFINE_int32(min_count, 2, "--compare: the admission's min_count.");
DEFINE_bool(churn, false, "--compare: a capacity of half the key space (rows evicted always).");
DEFINE_bool(vocabulary, false,
            "--compare: a vocabulary table of the key space's ids (rows found by number) instead "
            "of a table with admission and eviction.");
DEFINE_int64(memory_rows, 0, "Measure the memory of a table of this many rows instead.");
DEFINE_double(memory_capacity, 1.02,
              "--memory_rows: the table's eviction.max_rows, as a multiple of --memory_rows (a "
              "stripe evicts at its 1/64 share, and keys do not split exactly evenly); 0: no "
              "eviction.");

namespace pscluster {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

v1::TableSpec Spec(int64_t dim) {
  v1::TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(dim);
  spec.mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  spec.mutable_initializer()->set_min(-0.05f);
  spec.mutable_initializer()->set_max(0.05f);
  spec.mutable_initializer()->set_seed(7);
  spec.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.05f);
  spec.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator_value(0.1f);
  return spec;
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(const v1::TableSpec& spec) {
  constexpr int32_t kVirtualShards = 64;
  std::vector<int32_t> all(kVirtualShards);
  std::iota(all.begin(), all.end(), 0);
  return EmbeddingTable::Create(spec, all, kVirtualShards);
}

struct Timing {
  double push_ns = 0, pull_ns = 0;
};

// Warms `table` up with pushes of the whole key space (enough of them for admission), then
// times --rounds pushes and pulls of fresh random subsets; medians.
absl::StatusOr<Timing> Measure(EmbeddingTable& table, ThreadPool* pool, int warmups) {
  const int64_t n = FLAGS_keys;
  const int64_t dim = FLAGS_dim;
  std::vector<int64_t> space(static_cast<size_t>(FLAGS_key_space));
  std::iota(space.begin(), space.end(), 0);
  std::vector<float> out(static_cast<size_t>(n * dim));
  std::mt19937_64 rng(1);
  std::vector<float> grads(static_cast<size_t>(n * dim));
  std::uniform_real_distribution<float> grad(-0.01f, 0.01f);
  for (float& g : grads) g = grad(rng);
  int64_t step = 0;
  for (int w = 0; w < warmups; ++w) {
    for (int64_t begin = 0; begin < FLAGS_key_space; begin += n) {
      const int64_t count = std::min(n, FLAGS_key_space - begin);
      table.ObserveStep(step++);
      absl::Status s = table.Push(space.data() + begin, count, grads.data(), false, pool);
      if (!s.ok()) return s;
    }
  }
  std::vector<double> push_ns, pull_ns;
  const int64_t distinct = std::max<int64_t>(1, n / FLAGS_occurrences);
  std::vector<int64_t> request(static_cast<size_t>(n));
  for (int r = 0; r < FLAGS_rounds; ++r) {
    // A fresh random subset each round, as ps_bench draws them.
    for (int64_t i = 0; i < distinct; ++i) {
      std::swap(
          space[static_cast<size_t>(i)],
          space[static_cast<size_t>(i + static_cast<int64_t>(rng() % (FLAGS_key_space - i)))]);
    }
    for (int64_t i = 0; i < n; ++i) request[static_cast<size_t>(i)] = space[i % distinct];
    if (distinct < n) std::shuffle(request.begin(), request.end(), rng);
    table.ObserveStep(step++);
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = table.Push(request.data(), n, grads.data(), false, pool);
    auto t1 = std::chrono::steady_clock::now();
    absl::Status p = table.Pull(request.data(), n, out.data(), pool);
    auto t2 = std::chrono::steady_clock::now();
    if (!s.ok()) return s;
    if (!p.ok()) return p;
    push_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
    pull_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / n);
  }
  return Timing{Median(push_ns), Median(pull_ns)};
}

void Print(const std::string& name, double ns, double ratio) {
  const double row_bytes = static_cast<double>(FLAGS_dim) * sizeof(float);
  const std::string repeats =
      FLAGS_occurrences > 1 ? absl::StrCat("_", FLAGS_occurrences, "occurrences") : "";
  std::printf("BENCH table_%s_%lldx%d%s_%dthreads %.1f ns/key = %.0f MB/s of rows (%.1f Mkeys/s)",
              name.c_str(), static_cast<long long>(FLAGS_keys), FLAGS_dim, repeats.c_str(),
              FLAGS_threads, ns, row_bytes / ns * 1e3, 1e3 / ns);
  if (ratio > 0) std::printf(" ratio=%.3f", ratio);
  std::printf("\n");
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "table_bench: %s\n", s.ToString().c_str());
  return 1;
}

int RunSpeed() {
  std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(FLAGS_threads);
  if (!FLAGS_compare) {
    auto table = Create(Spec(FLAGS_dim));
    if (!table.ok()) return Fail(table.status());
    absl::StatusOr<Timing> t = Measure(**table, pool.get(), 1);
    if (!t.ok()) return Fail(t.status());
    Print("push", t->push_ns, 0);
    Print("pull", t->pull_ns, 0);
    return 0;
  }
  v1::TableSpec managed = Spec(FLAGS_dim);
  if (FLAGS_vocabulary) {
    managed.set_vocabulary_size(FLAGS_key_space);
  } else {
    managed.mutable_admission()->set_min_count(FLAGS_min_count);
    // Four counters per key of the space: few keys admitted early (model.proto).
    managed.mutable_admission()->set_sketch_width(std::min<int64_t>(4 * FLAGS_key_space, 1 << 26));
    managed.mutable_eviction()->set_ttl_steps(1000000);
    managed.mutable_eviction()->set_max_rows(FLAGS_churn ? FLAGS_key_space / 2
                                                         : 2 * FLAGS_key_space);
  }
  const std::string tag = FLAGS_vocabulary ? "vocabulary" : FLAGS_churn ? "churn" : "managed";
  for (int trial = 0; trial < FLAGS_trials; ++trial) {
    // A fresh table of each kind per trial, plain first.
    auto plain = Create(Spec(FLAGS_dim));
    if (!plain.ok()) return Fail(plain.status());
    absl::StatusOr<Timing> base = Measure(**plain, pool.get(), FLAGS_min_count);
    if (!base.ok()) return Fail(base.status());
    plain->reset();
    auto table = Create(managed);
    if (!table.ok()) return Fail(table.status());
    absl::StatusOr<Timing> t = Measure(**table, pool.get(), FLAGS_min_count);
    if (!t.ok()) return Fail(t.status());
    const EmbeddingTable::Counts c = (*table)->counts();
    std::printf("trial %d: %s table: %lld rows, %lld admitted, %lld evicted, %lld not admitted\n",
                trial, tag.c_str(), static_cast<long long>((*table)->num_rows()),
                static_cast<long long>(c.admitted), static_cast<long long>(c.evicted),
                static_cast<long long>(c.unadmitted));
    Print("push_plain", base->push_ns, 0);
    Print("push_" + tag, t->push_ns, base->push_ns / t->push_ns);
    Print("pull_plain", base->pull_ns, 0);
    Print("pull_" + tag, t->pull_ns, base->pull_ns / t->pull_ns);
  }
  return 0;
}

// The process's resident memory, in bytes (VmRSS of /proc/self/status).
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      status >> kb;
      return kb * 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

int RunMemory() {
  const int64_t rows = FLAGS_memory_rows;
  const int64_t dim = FLAGS_dim;
  v1::TableSpec spec = Spec(dim);
  const int64_t capacity = static_cast<int64_t>(FLAGS_memory_capacity * static_cast<double>(rows));
  if (capacity > 0) spec.mutable_eviction()->set_max_rows(capacity);
  std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(FLAGS_threads);
  constexpr int64_t kBatch = 100000;
  std::vector<int64_t> keys(kBatch);
  std::vector<float> grads(static_cast<size_t>(kBatch * dim), 0.001f);
  const int64_t before = ResidentBytes();
  auto table = Create(spec);
  if (!table.ok()) return Fail(table.status());
  const auto start = std::chrono::steady_clock::now();
  for (int64_t begin = 0; begin < rows; begin += kBatch) {
    const int64_t n = std::min(kBatch, rows - begin);
    // Scattered keys, as hashed feature ids are.
    for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(MixKey(begin + i) >> 1);
    absl::Status s = (*table)->Push(keys.data(), n, grads.data(), false, pool.get());
    if (!s.ok()) return Fail(s);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t after = ResidentBytes();
  const int64_t resident = (*table)->num_rows();
  const double own = 2.0 * static_cast<double>(dim) * sizeof(float);  // values and accumulator
  const double per_row = static_cast<double>(after - before) / static_cast<double>(resident);
  std::printf(
      "table of %lld rows of dim %lld (Adagrad), capacity %lld: filled in %.1f s (%.0f ns "
      "per new row); resident memory %.1f MiB -> %.1f MiB\n",
      static_cast<long long>(resident), static_cast<long long>(dim),
      static_cast<long long>(capacity), seconds, seconds * 1e9 / static_cast<double>(rows),
      before / 1048576.0, after / 1048576.0);
  std::printf(
      "BENCH table_memory_per_row_%lldx%lld %.1f bytes ratio=%.3f (to the row's %.0f "
      "bytes of values and slots; ListShards counts %lld)\n",
      static_cast<long long>(resident), static_cast<long long>(dim), per_row, per_row / own, own,
      static_cast<long long>((*table)->row_bytes()));

  // A checkpoint's cut of the table (CopyRows: every row with its key, count and tick, what a
  // save copies while pushes wait) against copying as many bytes from one contiguous buffer
  // into fresh memory of the same kind, the floor of any copy. Medians of --trials.
  const size_t stride = static_cast<size_t>(2 * dim);
  const size_t bytes = static_cast<size_t>(resident) * (stride * sizeof(float) + 8 + 8 + 4);
  std::vector<float, HugePageAllocator<float>> source(bytes / sizeof(float), 1.0f);
  std::vector<double> cut_seconds, prepared_seconds, copy_seconds;
  for (int trial = 0; trial < std::max(1, FLAGS_trials); ++trial) {
    {
      EmbeddingTable::RowsCopy copy;
      const auto t0 = std::chrono::steady_clock::now();
      (*table)->CopyRows(&copy);
      cut_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    {
      // Into memory made and faulted in before, as a ps task does after SAVE_PREPARE.
      EmbeddingTable::RowsCopy copy;
      copy.MakeRoom(static_cast<size_t>(resident), stride);
      const auto t0 = std::chrono::steady_clock::now();
      (*table)->CopyRows(&copy);
      prepared_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float, HugePageAllocator<float>> copy(source.begin(), source.end());
      copy_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double cut = median(cut_seconds), prepared = median(prepared_seconds);
  const double copy = median(copy_seconds);
  std::printf(
      "cut (CopyRows): %.3f s into new memory, %.3f s into memory made before; a contiguous "
      "copy of the same %.0f MiB into new memory: %.3f s (medians of %zu)\n",
      cut, prepared, bytes / 1048576.0, copy, cut_seconds.size());
  std::printf(
      "BENCH table_cut_%lldx%lld %.2f GB/s ratio=%.3f (to one contiguous copy of as many "
      "bytes into new memory)\n",
      static_cast<long long>(resident), static_cast<long long>(dim), bytes / cut / 1e9, copy / cut);
  std::printf(
      "BENCH table_cut_prepared_%lldx%lld %.2f GB/s ratio=%.3f (the same, into memory "
      "made before: SAVE_PREPARE)\n",
      static_cast<long long>(resident), static_cast<long long>(dim), bytes / prepared / 1e9,
      copy / prepared);

  // A marked cut (EmbeddingTable::MarkCut, what a save of a hashed table does): the pause is
  // the mark; the stripes are then taken one at a time (as the save writes them) while a push
  // of kBatch of the table's keys goes on before each, and the rows kept aside for the stripes
  // not taken yet are the cut's memory.
  std::vector<double> mark_seconds;
  double take_max = 0;
  int64_t kept_max = 0;
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < std::max(1, FLAGS_trials); ++trial) {
    const auto t0 = std::chrono::steady_clock::now();
    (*table)->MarkCut();
    mark_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EmbeddingTable::RowsCopy run;
    for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) {
      for (int64_t i = 0; i < kBatch; ++i) {
        keys[i] = static_cast<int64_t>(MixKey(static_cast<int64_t>(rng() % rows)) >> 1);
      }
      absl::Status pushed = (*table)->Push(keys.data(), kBatch, grads.data(), false, pool.get());
      if (!pushed.ok()) return Fail(pushed);
      kept_max = std::max(kept_max, (*table)->cut_kept_rows());
      run = EmbeddingTable::RowsCopy();
      const auto t1 = std::chrono::steady_clock::now();
      (*table)->TakeStripeCut(s, &run);
      take_max = std::max(
          take_max, std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
    }
  }
  const double mark = median(mark_seconds);
  std::printf(
      "marked cut (MarkCut): a pause of %.6f s against the copy's %.3f s; each stripe taken "
      "in at most %.3f s; with a push of %lld keys before each stripe, at most %lld rows kept "
      "aside (%.1f%% of the table)\n",
      mark, cut, take_max, static_cast<long long>(kBatch), static_cast<long long>(kept_max),
      100.0 * static_cast<double>(kept_max) / static_cast<double>(resident));
  std::printf(
      "BENCH table_cut_mark_%lldx%lld %.6f s ratio=%.1f (the pause of a marked cut; ratio: "
      "the copying cut's, into new memory, over it)\n",
      static_cast<long long>(resident), static_cast<long long>(dim), mark, cut / mark);
  std::printf(
      "BENCH table_cut_kept_%lldx%lld %.3f x (the most rows a marked cut kept aside while "
      "written, over the table's)\n",
      static_cast<long long>(resident), static_cast<long long>(dim),
      static_cast<double>(kept_max) / static_cast<double>(resident));

  // Pushes while the stripes are taken (a background save): another thread takes every stripe
  // of a fresh mark while this one pushes kSmall of the table's keys again and again, each
  // push timed. A stripe copied whole under its lock (chunk_rows: the stripe's rows, before
  // 2026-11-30), in chunks of EmbeddingTable::kCutChunkRows (07948fd), in chunks that also make
  // way for a waiting push every kCutYieldRows rows (the default), and no take at all.
  constexpr int64_t kSmall = 4096;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  const auto push_waits = [&](int64_t chunk_rows, int64_t yield_rows) -> std::vector<double> {
    std::vector<double> waits;
    std::atomic<bool> taking{chunk_rows > 0};
    std::thread taker;
    if (chunk_rows > 0) {
      (*table)->MarkCut();
      taker = std::thread([&] {
        // One buffer for every stripe, emptied and reused, as a save's writing thread does.
        EmbeddingTable::RowsCopy run;
        for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) {
          run.keys.clear();
          run.counts.clear();
          run.last.clear();
          run.rows.clear();
          (*table)->TakeStripeCut(s, &run, nullptr, chunk_rows, yield_rows);
        }
        taking = false;
      });
    }
    // Without a take: 200 pushes.
    const size_t untaken_pushes = 200;
    while (taking || (chunk_rows == 0 && waits.size() < untaken_pushes)) {
      for (int64_t i = 0; i < kSmall; ++i) {
        keys[i] = static_cast<int64_t>(MixKey(static_cast<int64_t>(rng() % rows)) >> 1);
      }
      const auto t1 = std::chrono::steady_clock::now();
      absl::Status pushed = (*table)->Push(keys.data(), kSmall, grads.data(), false, nullptr);
      waits.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
      if (!pushed.ok()) break;
    }
    if (taker.joinable()) taker.join();
    std::sort(waits.begin(), waits.end());
    return waits;
  };
  const auto at = [](const std::vector<double>& v, double q) {
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  };
  const std::vector<double> none = push_waits(0, kNever);
  const std::vector<double> whole = push_waits(kNever, kNever);
  const std::vector<double> chunked = push_waits(EmbeddingTable::kCutChunkRows, kNever);
  const std::vector<double> yielding =
      push_waits(EmbeddingTable::kCutChunkRows, EmbeddingTable::kCutYieldRows);
  for (const auto& [name, v] :
       {std::pair<const char*, const std::vector<double>*>{"no save", &none},
        {"stripes copied whole", &whole},
        {"stripes copied in chunks", &chunked},
        {"in chunks, making way for pushes", &yielding}}) {
    std::printf("pushes of %lld keys, %s: %zu pushes, median %.3f ms, p99 %.3f ms, max %.3f ms\n",
                static_cast<long long>(kSmall), name, v->size(), at(*v, 0.5) * 1e3,
                at(*v, 0.99) * 1e3, v->empty() ? 0.0 : v->back() * 1e3);
  }
  std::printf(
      "BENCH table_cut_push_p99_%lldx%lld %.3f ms ratio=%.2f (a push's 99th percentile while "
      "a save takes the stripes in chunks, making way for pushes; ratio: copied whole / so)\n",
      static_cast<long long>(resident), static_cast<long long>(dim), at(yielding, 0.99) * 1e3,
      at(whole, 0.99) / std::max(1e-9, at(yielding, 0.99)));
  std::printf(
      "BENCH table_cut_push_median_%lldx%lld %.3f ms ratio=%.2f (a push's median while a save "
      "takes the stripes in chunks, making way for pushes; ratio: over no save)\n",
      static_cast<long long>(resident), static_cast<long long>(dim), at(yielding, 0.5) * 1e3,
      at(yielding, 0.5) / std::max(1e-9, at(none, 0.5)));
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  pscluster::SetMutexChecksFromEnvironment();  // (off: as the daemons)
  if (FLAGS_occurrences < 1 || FLAGS_occurrences > FLAGS_keys) {
    std::fprintf(stderr, "table_bench: --occurrences %d: expected 1 to --keys (%lld)\n",
                 FLAGS_occurrences, static_cast<long long>(FLAGS_keys));
    return 2;
  }
  return FLAGS_memory_rows > 0 ? pscluster::RunMemory() : pscluster::RunSpeed();
}
