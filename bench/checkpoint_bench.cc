// checkpoint_bench: how fast a ps task's checkpoint file is written and read back, against the
// disk's own speed measured in the same run (issue 36: "save and restore at the disk's speed").
//
// One embedding table part of --rows rows (random distinct keys; --stride floats each: values
// and optimizer slots, 32 = a 16-float row with Adagrad's accumulator and more), written with
// the checkpoint's own writer (storage/checkpoint.h: CheckpointWriter::WriteTable, then Finish,
// which flushes and syncs) into --dir, then read back with CheckpointReader::ReadTable (every
// row's checksum verified). The baseline is dd writing the same number of bytes with
// conv=fsync into the same folder, and reading that file back, in the same run.
//
//   bazel run -c opt //bench:checkpoint_bench -- [--rows N] [--stride F] [--dir DIR] [--trials N]
//
// Prints per trial, then the medians as
//   BENCH checkpoint_write_<rows>x<stride> <MB/s> MB/s ratio=<over dd's write>
//   BENCH checkpoint_read_<rows>x<stride> <MB/s> MB/s ratio=<over dd's read>
// and the writer's peak resident memory above what the process held before it (VmHWM, reset
// before each write), against the table's own bytes.
//
// Then the same rows through a ps task (ParameterStore with ps_server's apply threads, or
// --apply_threads: a table of dim stride / 2 with Adagrad, filled by pushes), saved as the chief
// saves (SaveShards: the cut, then the write) and restored into a second ps task as a recovery
// restores (RestoreShards: read, checked, inserted), each against dd in the same trial; the restore
// twice, into a new ps task each time, the BENCH line giving the second and the first in
// parentheses (the first takes memory the process never had, which some virtual machines are slow
// to give):
//   BENCH ckpt_save_vs_disk <ratio> x      BENCH ckpt_restore_vs_disk <ratio> x
//
// Then incremental checkpoints (a full save, --delta_fraction of the rows pushed, a delta on
// it), against a full save of the same state, and the restore of full + delta against the
// restore of that full one (after an untimed restore, so that both get memory the process had):
//   BENCH ckpt_delta_save_<pct>pct <s> s ratio=<full save's seconds over the delta's>
//   BENCH ckpt_chain_restore_<pct>pct <s> s ratio=<over the full one's restore>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/mutex_checks.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "proto/model.pb.h"
#include "proto/ps_service.pb.h"
#include "ps_server/parameter_store.h"
#include "storage/checkpoint.h"

DEFINE_int64(rows, 4000000, "Rows of the table part written.");
DEFINE_int32(stride, 32, "Floats per row (values and optimizer slots).");
DEFINE_string(dir, "", "Where to write (default: $TMPDIR or /tmp).");
DEFINE_int32(trials, 3, "Trials of each measure; the medians are printed.");
DEFINE_double(delta_fraction, 0.1,
              "Incremental checkpoints: the fraction of the rows pushed between a full save and "
              "the delta on it.");
DEFINE_int32(apply_threads, -1,
             "The ps tasks' apply threads, which a restore reads and inserts on (-1: ps_server's "
             "default, min(cores - 1, 7)).");

namespace pscluster {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A line of /proc/self/status ("VmRSS", "VmHWM") in bytes.
int64_t StatusBytes(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kb = 0;
  const size_t len = std::strlen(field);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
      kb = std::strtoll(line + len + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

// Resets the peak resident size (VmHWM) to the current one.
void ResetPeak() {
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5\n", f);
    std::fclose(f);
  }
}

// Runs `command` (a dd) and returns the seconds dd reported ("..., 1.234 s, ..."), or -1.
double DdSeconds(const std::string& command) {
  const std::string full = command + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  pclose(p);
  for (absl::string_view part : absl::StrSplit(out, ',')) {
    part = absl::StripAsciiWhitespace(part);
    double s = 0;
    if (absl::ConsumeSuffix(&part, " s") && absl::SimpleAtod(part, &s)) return s;
  }
  std::fprintf(stderr, "checkpoint_bench: cannot read dd's time from: %s\n", out.c_str());
  return -1;
}

void DropCaches() {
  sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("3\n", f);
    std::fclose(f);
  }
}

// A ps task's store as ps_server makes it (its apply threads).
ParameterStoreOptions StoreOptions() {
  ParameterStoreOptions options;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  options.apply_threads =
      FLAGS_apply_threads >= 0 ? FLAGS_apply_threads : std::max(0, std::min(cores - 1, 7));
  return options;
}

// Medians over the trials, in MB/s of records.
struct PsFigures {
  // restore_first: the process's first restore; restore: the same again into a new ps task.
  double save = 0, restore_first = 0, restore = 0, dd_write = 0, dd_read = 0;
};

v1::CreateShardsRequest TableRequest(int64_t stride) {
  v1::CreateShardsRequest create;
  v1::TableShardSpec* t = create.add_tables();
  t->mutable_table()->set_name("emb");
  t->mutable_table()->set_dim(stride / 2);
  t->mutable_table()->mutable_initializer()->set_kind(v1::InitializerSpec::CONSTANT);
  t->mutable_table()->mutable_initializer()->set_value(0.5f);
  t->mutable_table()->mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  t->set_num_virtual_shards(1);
  t->add_virtual_shards(0);
  return create;
}

PsFigures ThroughAPsTask(const std::string& dir, const std::vector<int64_t>& keys, int64_t stride,
                         double record_bytes) {
  CHECK_EQ(stride % 2, 0) << "--stride: a row of values and Adagrad's accumulator";
  ParameterStore source{StoreOptions()};
  v1::CreateShardsResponse created;
  CHECK(source.CreateShards(TableRequest(stride), &created).ok());
  constexpr size_t kBatch = 100000;
  std::vector<float> grads(kBatch * (stride / 2), 0.25f);
  for (size_t begin = 0; begin < keys.size(); begin += kBatch) {
    const size_t n = std::min(kBatch, keys.size() - begin);
    v1::PushSparseRequest push;
    push.set_table("emb");
    v1::PushSparseResponse pushed;
    CHECK(source
              .PushSparse(push, keys.data() + begin, static_cast<int64_t>(n),
                          absl::string_view(reinterpret_cast<const char*>(grads.data()),
                                            n * (stride / 2) * sizeof(float)),
                          &pushed)
              .ok());
  }
  std::vector<double> save, restore_first, restore, dd_write, dd_read;
  for (int t = 0; t < FLAGS_trials; ++t) {
    const std::string file = dir + "/dd.bin";
    const int64_t mib = static_cast<int64_t>(record_bytes / (1 << 20)) + 1;
    dd_write.push_back(
        record_bytes / 1e6 /
        DdSeconds(absl::StrCat("dd if=/dev/zero of=", file, " bs=1M count=", mib, " conv=fsync")));
    DropCaches();
    dd_read.push_back(record_bytes / 1e6 /
                      DdSeconds(absl::StrCat("dd if=", file, " of=/dev/null bs=1M")));
    std::filesystem::remove(file);

    v1::SaveShardsRequest request;
    request.set_checkpoint_path(absl::StrCat(dir, "/ps-ckpt-", t));
    v1::SaveShardsResponse saved;
    Clock::time_point start = Clock::now();
    CHECK(source.Save(request, &saved).ok());
    save.push_back(record_bytes / 1e6 / Seconds(start));

    // Twice, each into a new ps task from a cold page cache: the first restore of a trial
    // takes memory the process has not had before (the first touch of a page is slow in some
    // virtual machines: on the development VM, which gives freed memory back to its host, it
    // costs more than the restore's own work), the second gets the memory the first freed.
    for (std::vector<double>* figures : {&restore_first, &restore}) {
      DropCaches();
      ParameterStore target{StoreOptions()};
      CHECK(target.CreateShards(TableRequest(stride), &created).ok());
      v1::RestoreShardsRequest restore_request;
      restore_request.set_checkpoint_path(request.checkpoint_path());
      *restore_request.mutable_saved() = saved.shards();
      v1::RestoreShardsResponse restored;
      start = Clock::now();
      CHECK(target.Restore(restore_request, &restored).ok());
      figures->push_back(record_bytes / 1e6 / Seconds(start));
      CHECK_EQ(target.ListShards().shards(0).rows(), static_cast<int64_t>(keys.size()));
    }
    std::filesystem::remove_all(request.checkpoint_path());
    std::printf(
        "through a ps task, trial %d: save %.0f MB/s, restore %.0f MB/s (the first %.0f); dd "
        "write %.0f MB/s, read %.0f MB/s\n",
        t + 1, save.back(), restore.back(), restore_first.back(), dd_write.back(), dd_read.back());
  }
  return {Median(save), Median(restore_first), Median(restore), Median(dd_write), Median(dd_read)};
}

// Incremental checkpoints through a ps task (docs/checkpoints.md): the table full of `keys`, a
// full save that tracks changes, then pushes to `fraction` of the rows, then a delta save on
// it, and a full save of the same state; then restores of the chain (full + delta) and of the
// full one. Medians over the trials.
struct DeltaFigures {
  double full_save = 0, delta_save = 0, full_bytes = 0, delta_bytes = 0;
  double chain_restore = 0, full_restore = 0;
};

DeltaFigures Incremental(const std::string& dir, const std::vector<int64_t>& keys, int64_t stride,
                         double fraction) {
  ParameterStore source{StoreOptions()};
  v1::CreateShardsResponse created;
  CHECK(source.CreateShards(TableRequest(stride), &created).ok());
  constexpr size_t kBatch = 100000;
  std::vector<float> grads(kBatch * (stride / 2), 0.25f);
  const auto push = [&](size_t begin, size_t end) {
    for (; begin < end; begin += kBatch) {
      const size_t n = std::min(kBatch, end - begin);
      v1::PushSparseRequest request;
      request.set_table("emb");
      v1::PushSparseResponse pushed;
      CHECK(source
                .PushSparse(request, keys.data() + begin, static_cast<int64_t>(n),
                            absl::string_view(reinterpret_cast<const char*>(grads.data()),
                                              n * (stride / 2) * sizeof(float)),
                            &pushed)
                .ok());
    }
  };
  push(0, keys.size());
  const auto bytes_of = [](const v1::SaveShardsResponse& r) {
    return static_cast<double>(r.bytes());
  };
  std::vector<double> full_save, delta_save, chain_restore, full_restore;
  DeltaFigures out;
  const size_t changed = static_cast<size_t>(fraction * static_cast<double>(keys.size()));
  for (int t = 0; t < FLAGS_trials; ++t) {
    const std::string base = absl::StrCat(dir, "/base-", t),
                      delta = absl::StrCat(dir, "/delta-", t),
                      whole = absl::StrCat(dir, "/whole-", t);
    v1::SaveShardsRequest request;
    request.set_checkpoint_path(base);
    request.set_track_changes(true);
    v1::SaveShardsResponse base_saved, delta_saved, whole_saved;
    CHECK(source.Save(request, &base_saved).ok());
    // A different slice of the rows each trial.
    const size_t begin = (static_cast<size_t>(t) * changed) % keys.size();
    push(begin, std::min(keys.size(), begin + changed));
    request.set_checkpoint_path(delta);
    request.set_delta_base(absl::StrCat("base-", t));
    Clock::time_point start = Clock::now();
    CHECK(source.Save(request, &delta_saved).ok());
    delta_save.push_back(Seconds(start));
    request.set_checkpoint_path(whole);
    request.clear_delta_base();
    start = Clock::now();
    CHECK(source.Save(request, &whole_saved).ok());
    full_save.push_back(Seconds(start));
    out.full_bytes = bytes_of(whole_saved);
    out.delta_bytes = bytes_of(delta_saved);

    // An untimed restore first, so that both timed ones get memory the process had (see
    // ThroughAPsTask).
    for (const int which : {0, 1, 2}) {
      const bool chain = which == 1;
      DropCaches();
      ParameterStore target{StoreOptions()};
      CHECK(target.CreateShards(TableRequest(stride), &created).ok());
      v1::RestoreShardsRequest restore;
      if (chain) {
        v1::CheckpointLink* link = restore.add_chain();
        link->set_checkpoint_path(base);
        *link->mutable_saved() = base_saved.shards();
        restore.set_checkpoint_path(delta);
        *restore.mutable_saved() = delta_saved.shards();
      } else {
        restore.set_checkpoint_path(whole);
        *restore.mutable_saved() = whole_saved.shards();
      }
      v1::RestoreShardsResponse restored;
      start = Clock::now();
      CHECK(target.Restore(restore, &restored).ok());
      if (which > 0) (chain ? chain_restore : full_restore).push_back(Seconds(start));
      CHECK_EQ(target.ListShards().shards(0).rows(), static_cast<int64_t>(keys.size()));
    }
    for (const std::string& path : {base, delta, whole}) std::filesystem::remove_all(path);
    std::printf(
        "incremental, trial %d: %.0f %% of the rows changed: delta save %.2f s (%.0f MB), full "
        "save %.2f s (%.0f MB); restore of full + delta %.2f s, of the full one %.2f s\n",
        t + 1, fraction * 100, delta_save.back(), out.delta_bytes / 1e6, full_save.back(),
        out.full_bytes / 1e6, chain_restore.back(), full_restore.back());
  }
  out.full_save = Median(full_save);
  out.delta_save = Median(delta_save);
  out.chain_restore = Median(chain_restore);
  out.full_restore = Median(full_restore);
  return out;
}

int Main() {
  const std::string root = !FLAGS_dir.empty()                 ? FLAGS_dir
                           : std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR")
                                                              : "/tmp";
  const std::string dir = absl::StrCat(root, "/checkpoint_bench.", getpid());
  std::filesystem::create_directories(dir);
  const int64_t n = FLAGS_rows;
  const int64_t stride = FLAGS_stride;

  std::mt19937_64 rng(7);
  std::vector<int64_t> keys;
  keys.reserve(n);
  absl::flat_hash_set<int64_t> seen;
  while (static_cast<int64_t>(keys.size()) < n) {
    const int64_t k = static_cast<int64_t>(rng() >> 1);
    if (seen.insert(k).second) keys.push_back(k);
  }
  seen.clear();
  std::vector<float> rows(n * stride);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : rows) x = u(rng);
  std::vector<int64_t> counts(n, 1);
  v1::TableSpec spec;
  spec.set_name("emb");
  spec.set_dim(stride / 2);
  // What the records hold: a key, an update count and the row (storage/checkpoint.cc's Record).
  const double record_bytes = static_cast<double>(n) * (stride * 4 + 8 + 8);
  std::printf("checkpoint_bench: %lld rows x %lld floats (%.0f MB of records) in %s\n",
              static_cast<long long>(n), static_cast<long long>(stride), record_bytes / 1e6,
              dir.c_str());

  std::vector<double> write_mbs, read_mbs, dd_write_mbs, dd_read_mbs;
  int64_t peak_over = 0;
  for (int t = 0; t < FLAGS_trials; ++t) {
    // The disk: the same bytes, sequentially, synced (dd conv=fsync), and read back cold.
    const std::string file = dir + "/dd.bin";
    const int64_t mib = static_cast<int64_t>(record_bytes / (1 << 20)) + 1;
    const double dd_w =
        DdSeconds(absl::StrCat("dd if=/dev/zero of=", file, " bs=1M count=", mib, " conv=fsync"));
    DropCaches();
    const double dd_r = DdSeconds(absl::StrCat("dd if=", file, " of=/dev/null bs=1M"));
    std::filesystem::remove(file);

    const std::string ckpt = absl::StrCat(dir, "/ckpt-", t);
    ResetPeak();
    const int64_t before = StatusBytes("VmRSS");
    Clock::time_point start = Clock::now();
    auto writer = CheckpointWriter::Open(ckpt, 0);
    CHECK(writer.ok()) << writer.status();
    auto saved = (*writer)->WriteTable(spec, keys, rows, counts, stride);
    CHECK(saved.ok()) << saved.status();
    CHECK((*writer)->Finish().ok());
    const double w = Seconds(start);
    peak_over = std::max(peak_over, StatusBytes("VmHWM") - before);
    writer->reset();

    DropCaches();
    start = Clock::now();
    auto reader = CheckpointReader::Open(ckpt + "/ps-0");
    CHECK(reader.ok()) << reader.status();
    int64_t got = 0;
    double sum = 0;
    CHECK((*reader)
              ->ReadTable(
                  *saved,
                  [&](int64_t, const float* row, int64_t) {
                    ++got;
                    sum += row[0];
                  },
                  stride)
              .ok());
    const double r = Seconds(start);
    CHECK_EQ(got, n);
    reader->reset();
    std::filesystem::remove_all(ckpt);

    write_mbs.push_back(record_bytes / 1e6 / w);
    read_mbs.push_back(record_bytes / 1e6 / r);
    dd_write_mbs.push_back(record_bytes / 1e6 / dd_w);
    dd_read_mbs.push_back(record_bytes / 1e6 / dd_r);
    std::printf(
        "trial %d: write %.2f s (%.0f MB/s), read %.2f s (%.0f MB/s); dd write %.0f MB/s, read "
        "%.0f MB/s (checksum of the rows read %.3f)\n",
        t + 1, w, write_mbs.back(), r, read_mbs.back(), dd_write_mbs.back(), dd_read_mbs.back(),
        sum);
  }
  PsFigures ps = ThroughAPsTask(dir, keys, stride, record_bytes);
  const DeltaFigures inc = Incremental(dir, keys, stride, FLAGS_delta_fraction);
  std::filesystem::remove_all(dir);
  const double w = Median(write_mbs), r = Median(read_mbs);
  const double dw = Median(dd_write_mbs), dr = Median(dd_read_mbs);
  const std::string shape = absl::StrCat(n, "x", stride);
  std::printf("BENCH checkpoint_dd_write %.0f MB/s ratio=1.00\n", dw);
  std::printf("BENCH checkpoint_dd_read %.0f MB/s ratio=1.00\n", dr);
  std::printf("BENCH checkpoint_write_%s %.0f MB/s ratio=%.2f\n", shape.c_str(), w, w / dw);
  std::printf("BENCH checkpoint_read_%s %.0f MB/s ratio=%.2f\n", shape.c_str(), r, r / dr);
  std::printf(
      "BENCH checkpoint_write_peak_memory_%s %.0f MB ratio=%.2f (over the table's %.0f MB)\n",
      shape.c_str(), peak_over / 1e6, peak_over / (n * stride * 4.0), n * stride * 4 / 1e6);
  std::printf("BENCH ckpt_save_vs_disk %.2f x (a ps task's save of %s: %.0f MB/s, dd %.0f)\n",
              ps.save / ps.dd_write, shape.c_str(), ps.save, ps.dd_write);
  std::printf(
      "BENCH ckpt_restore_vs_disk %.2f x (into a ps task: %.0f MB/s, dd %.0f; the process's "
      "first restore %.0f MB/s, %.2f x)\n",
      ps.restore / ps.dd_read, ps.restore, ps.dd_read, ps.restore_first,
      ps.restore_first / ps.dd_read);
  const int percent = static_cast<int>(FLAGS_delta_fraction * 100 + 0.5);
  std::printf(
      "BENCH ckpt_delta_save_%dpct %.2f s ratio=%.2f (a delta of %d %% of the rows changed, %.0f "
      "MB, against a full save of the same state, %.2f s and %.0f MB)\n",
      percent, inc.delta_save, inc.full_save / inc.delta_save, percent, inc.delta_bytes / 1e6,
      inc.full_save, inc.full_bytes / 1e6);
  std::printf(
      "BENCH ckpt_chain_restore_%dpct %.2f s ratio=%.2f (full + that delta, against the full "
      "checkpoint of the same state, %.2f s)\n",
      percent, inc.chain_restore, inc.chain_restore / inc.full_restore, inc.full_restore);
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  pscluster::SetMutexChecksFromEnvironment();  // (off: as the daemons)
  return pscluster::Main();
}
