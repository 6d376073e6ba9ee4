#include "storage/checkpoint.h"

#include <signal.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string d = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

v1::DenseShardSpec Spec() {
  v1::DenseShardSpec spec;
  spec.mutable_variable()->set_name("w");
  spec.mutable_variable()->mutable_shape()->add_dims(3);
  spec.mutable_partition()->set_variable("w");
  spec.mutable_partition()->set_partition(1);
  spec.mutable_partition()->set_row_begin(1);
  spec.mutable_partition()->set_row_end(3);
  return spec;
}

// Writes ckpt-<step> with one dense partition and a table part, and commits it.
// `crash_points` may kill the process on the way.
v1::CheckpointManifest Write(const std::string& dir, int64_t step,
                             CrashPoints* crash_points = nullptr) {
  const std::string path = absl::StrCat(dir, "/", CheckpointDirName(step));
  auto writer = CheckpointWriter::Open(path, 0, crash_points);
  CHECK(writer.ok()) << writer.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(step);
  auto dense = (*writer)->WriteDense(Spec(), 7, {1, 2, 3, 4});
  CHECK(dense.ok());
  *manifest.add_shards() = *dense;
  v1::TableSpec table;
  table.set_name("emb");
  table.set_dim(2);
  auto rows = (*writer)->WriteTable(table, {5, -9, 1LL << 40}, {1, 2, 3, 4, 5, 6}, {1, 2, 3}, 2);
  CHECK(rows.ok());
  *manifest.add_shards() = *rows;
  CHECK((*writer)->Finish().ok());
  CHECK(CommitManifest(path, manifest, crash_points).ok());
  return manifest;
}

TEST(CheckpointTest, WrittenShardsReadBackAndVerify) {
  const std::string dir = Dir("roundtrip");
  v1::CheckpointManifest m = Write(dir, 120);
  const std::string path = dir + "/ckpt-0000000120";
  auto manifest = ReadManifest(path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 120);
  auto reader = CheckpointReader::Open(path + "/ps-0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto dense = (*reader)->ReadDense(m.shards(0));
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->updates, 7);
  EXPECT_THAT(dense->values_and_slots, ::testing::ElementsAre(1, 2, 3, 4));
  std::vector<int64_t> keys;
  std::vector<float> firsts;
  ASSERT_TRUE((*reader)
                  ->ReadTable(m.shards(1),
                              [&](int64_t key, const float* row, int64_t t) {
                                keys.push_back(key);
                                firsts.push_back(row[0]);
                                EXPECT_EQ(t, key == 5 ? 1 : key == -9 ? 2 : 3);
                              })
                  .ok());
  EXPECT_THAT(keys, ::testing::ElementsAre(-9, 5, 1LL << 40));  // sorted by key
  EXPECT_THAT(firsts, ::testing::ElementsAre(3, 1, 5));
  EXPECT_TRUE(VerifyCheckpoint(path).ok());
}

// Table parts go into the shard file as table files of their own, taken in whole: several
// tables (one empty) beside dense records read back each as written, and the checkpoint folder
// holds the shard file and the manifest only (no table file left beside it).
TEST(CheckpointTest, SeveralTablesReadBackAndLeaveNothingBeside) {
  const std::string path = Dir("tables") + "/ckpt-0000000003";
  auto writer = CheckpointWriter::Open(path, 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(3);
  v1::TableSpec a, b, empty;
  a.set_name("a");
  b.set_name("b");
  empty.set_name("empty");
  std::vector<int64_t> keys;
  std::vector<float> rows;
  for (int64_t k = 0; k < 10000; ++k) {
    keys.push_back(k * 7919 - 40000);
    rows.push_back(static_cast<float>(k));
  }
  std::vector<int64_t> counts(keys.size(), 2);
  auto saved_a = (*writer)->WriteTable(a, keys, rows, counts, 1);
  auto dense = (*writer)->WriteDense(Spec(), 7, {1, 2, 3, 4});
  auto saved_b = (*writer)->WriteTable(b, {3}, {0.5f}, {9}, 1);
  auto saved_empty = (*writer)->WriteTable(empty, {}, {}, {}, 1);
  ASSERT_TRUE(saved_a.ok() && dense.ok() && saved_b.ok() && saved_empty.ok());
  for (const auto* s : {&*saved_a, &*dense, &*saved_b, &*saved_empty}) *manifest.add_shards() = *s;
  ASSERT_TRUE((*writer)->Finish().ok());
  ASSERT_TRUE(CommitManifest(path, manifest).ok());
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(path)) {
    entries.push_back(e.path().filename().string());
  }
  EXPECT_THAT(entries, ::testing::UnorderedElementsAre("ps-0", "MANIFEST.json"));
  EXPECT_TRUE(VerifyCheckpoint(path).ok());

  auto reader = CheckpointReader::Open(path + "/ps-0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::map<int64_t, float> got;
  ASSERT_TRUE((*reader)
                  ->ReadTable(*saved_a,
                              [&](int64_t key, const float* row, int64_t t) {
                                EXPECT_EQ(t, 2);
                                got[key] = row[0];
                              })
                  .ok());
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(got[keys[i]], rows[i]) << keys[i];
  int b_rows = 0, empty_rows = 0;
  ASSERT_TRUE((*reader)
                  ->ReadTable(*saved_b,
                              [&](int64_t key, const float* row, int64_t t) {
                                EXPECT_EQ(key, 3);
                                EXPECT_EQ(row[0], 0.5f);
                                EXPECT_EQ(t, 9);
                                ++b_rows;
                              })
                  .ok());
  ASSERT_TRUE((*reader)
                  ->ReadTable(*saved_empty, [&](int64_t, const float*, int64_t) { ++empty_rows; })
                  .ok());
  EXPECT_EQ(b_rows, 1);
  EXPECT_EQ(empty_rows, 0);
  auto d = (*reader)->ReadDense(*dense);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->values_and_slots, ::testing::ElementsAre(1, 2, 3, 4));
}

// A table part in blocks of rows: each malformed block is DATA_LOSS naming the file, the table
// and what is wrong; a well-formed one decodes.
TEST(CheckpointTest, MalformedBlocksOfRowsAreDataLoss) {
  v1::SavedShard saved;
  saved.set_name("emb");
  saved.set_is_table(true);
  saved.set_row_block(4);
  const std::string prefix = TablePartDecoder::Prefix(saved);
  // A block of n rows of one float each: keys, counts 1, rows = key / 10.
  auto block = [](std::vector<int64_t> keys, int64_t n_field) {
    const int64_t n = static_cast<int64_t>(keys.size());
    std::string value(8 + 16 * n + 4 * n, '\0');
    std::memcpy(value.data(), &n_field, 8);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t one = 1;
      const float row = keys[j] / 10.0f;
      std::memcpy(value.data() + 8 + 8 * j, &keys[j], 8);
      std::memcpy(value.data() + 8 + 8 * (n + j), &one, 8);
      std::memcpy(value.data() + 8 + 16 * n + 4 * j, &row, 4);
    }
    return value;
  };
  auto key = [&](int64_t first) {
    uint64_t u = static_cast<uint64_t>(first) ^ (uint64_t{1} << 63);
    std::string k = prefix + std::string(8, '\0');
    for (int i = 7; i >= 0; --i, u >>= 8) k[prefix.size() + i] = static_cast<char>(u & 0xff);
    return k;
  };
  struct Case {
    std::string what, key, value, message;
  };
  const std::vector<Case> cases = {
      {"no rows", key(1), block({}, 0), "holding 0 rows, expected 1 to 4"},
      {"too many rows", key(1), block({1, 2, 3, 4, 5}, 5), "holding 5 rows, expected 1 to 4"},
      {"a wrong count", key(1), block({1, 2}, 3), "bytes for 3 rows"},
      {"keys not increasing", key(5), block({5, 3}, 2), "key 3 after 5: keys must increase"},
      {"another first key", key(2), block({1, 3}, 2), "first row's key 1 is not the record's, 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TablePartDecoder decoder("ckpt-0000000001/ps-0", saved);
    const absl::Status s = decoder.Add(c.key, c.value);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("checkpoint file ckpt-0000000001/ps-0: table emb has a malformed "
                          "block of rows: "));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  // Keys must also increase from one block to the next.
  {
    TablePartDecoder decoder("ckpt-0000000001/ps-0", saved);
    ASSERT_TRUE(decoder.Add(key(5), block({5, 9}, 2)).ok());
    const absl::Status s = decoder.Add(key(7), block({7}, 1));
    EXPECT_THAT(std::string(s.message()), HasSubstr("key 7 after 9: keys must increase"));
  }
  // Two good blocks give back their rows, in order.
  TablePartDecoder decoder("ckpt-0000000001/ps-0", saved);
  const std::string a = block({-3, 4}, 2), b = block({10}, 1);
  ASSERT_TRUE(decoder.Add(key(-3), a).ok());
  ASSERT_TRUE(decoder.Add(key(10), b).ok());
  uint32_t crc = 0;
  for (const auto& [k, v] : {std::pair{key(-3), a}, std::pair{key(10), b}}) {
    crc = static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(k.data()), k.size()));
    crc = static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(v.data()), v.size()));
  }
  saved.set_checksum(crc);
  saved.set_rows(3);
  std::vector<int64_t> keys;
  std::vector<float> rows;
  ASSERT_TRUE(decoder
                  .Finish([&](int64_t k, const float* row, int64_t t, int64_t stride) {
                    EXPECT_EQ(t, 1);
                    EXPECT_EQ(stride, 1);
                    keys.push_back(k);
                    rows.push_back(row[0]);
                  })
                  .ok());
  EXPECT_THAT(keys, ::testing::ElementsAre(-3, 4, 10));
  EXPECT_THAT(rows, ::testing::ElementsAre(-0.3f, 0.4f, 1.0f));
}

// A table written in runs (a ps writes its table stripe by stripe): each run's rows in any
// order, some runs empty, the keys of the runs interleaved; read back whole, the part verified;
// a manifest that counts fewer runs, or none, is DATA_LOSS.
TEST(CheckpointTest, ATableWrittenInRunsReadsBack) {
  const std::string path = Dir("runs") + "/ckpt-0000000004";
  auto writer = CheckpointWriter::Open(path, 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  v1::TableSpec table;
  table.set_name("emb");
  table.set_dim(1);
  EXPECT_EQ((*writer)->WriteTableRuns(table, 2, 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Run r holds keys 3i + r, given in decreasing order: rows (key, -key), count key % 5.
  const std::vector<int64_t> sizes = {2500, 0, 1500};
  std::vector<int64_t> keys, counts;
  std::vector<float> rows;
  std::vector<int> asked;
  auto saved = (*writer)->WriteTableRuns(table, 2, 3,
                                         [&](int r) -> absl::StatusOr<CheckpointWriter::TableRun> {
                                           asked.push_back(r);
                                           keys.clear();
                                           counts.clear();
                                           rows.clear();
                                           for (int64_t i = sizes[r] - 1; i >= 0; --i) {
                                             const int64_t key = 3 * i + r - 2000;
                                             keys.push_back(key);
                                             counts.push_back((key % 5 + 5) % 5);
                                             rows.push_back(static_cast<float>(key));
                                             rows.push_back(static_cast<float>(-key));
                                           }
                                           return CheckpointWriter::TableRun{keys, counts, rows};
                                         });
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_THAT(asked, ::testing::ElementsAre(0, 1, 2));
  EXPECT_EQ(saved->runs(), 3);
  EXPECT_EQ(saved->rows(), 4000);
  v1::CheckpointManifest manifest;
  manifest.set_step(4);
  *manifest.add_shards() = *saved;
  ASSERT_TRUE((*writer)->Finish().ok());
  ASSERT_TRUE(CommitManifest(path, manifest).ok());
  EXPECT_TRUE(VerifyCheckpoint(path).ok());
  auto reader = CheckpointReader::Open(path + "/ps-0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::map<int64_t, std::pair<float, int64_t>> got;
  ASSERT_TRUE((*reader)
                  ->ReadTable(
                      *saved,
                      [&](int64_t key, const float* row, int64_t t) {
                        EXPECT_EQ(row[1], -row[0]);
                        got[key] = {row[0], t};
                      },
                      2)
                  .ok());
  ASSERT_EQ(got.size(), 4000u);
  for (const auto& [key, row] : got) {
    EXPECT_EQ(row.first, static_cast<float>(key));
    EXPECT_EQ(row.second, (key % 5 + 5) % 5);
    const int64_t r = (key + 2000) % 3;
    EXPECT_TRUE(r == 0 || r == 2) << key;
  }

  // The same runs written in ranges on a pool's threads (one range a run, the empty one
  // included), a delta's removed keys too: the same part, its rows read back alike.
  {
    ThreadPool pool(2);
    const std::string ranged_path = Dir("runs_ranged") + "/ckpt-0000000004";
    auto ranged_writer = CheckpointWriter::Open(ranged_path, 0);
    ASSERT_TRUE(ranged_writer.ok()) << ranged_writer.status();
    std::vector<std::vector<int64_t>> run_keys(3), run_counts(3), run_removed(3);
    std::vector<std::vector<float>> run_rows(3);
    absl::Mutex asked_mu;
    std::set<int> asked_ranged;
    const auto next = [&](int r) -> absl::StatusOr<CheckpointWriter::TableRun> {
      {
        absl::MutexLock lock(&asked_mu);
        EXPECT_TRUE(asked_ranged.insert(r).second) << "run " << r << " asked twice";
      }
      for (int64_t i = sizes[r] - 1; i >= 0; --i) {
        const int64_t key = 3 * i + r - 2000;
        run_keys[r].push_back(key);
        run_counts[r].push_back((key % 5 + 5) % 5);
        run_rows[r].push_back(static_cast<float>(key));
        run_rows[r].push_back(static_cast<float>(-key));
      }
      run_removed[r] = {100000 + r, 50000 + r};
      return CheckpointWriter::TableRun{run_keys[r], run_counts[r], run_rows[r], run_removed[r]};
    };
    auto ranged = (*ranged_writer)->WriteTableRuns(table, 2, 3, next, /*delta=*/false, &pool);
    ASSERT_TRUE(ranged.ok()) << ranged.status();
    EXPECT_EQ(asked_ranged, std::set<int>({0, 1, 2}));
    EXPECT_EQ(ranged->checksum(), saved->checksum());
    EXPECT_EQ(ranged->rows(), saved->rows());
    EXPECT_EQ(ranged->bytes(), saved->bytes());
    EXPECT_EQ(ranged->runs(), 3);
    // A delta part of the same rows, and its removed keys, sequentially and in ranges.
    for (auto& v : run_keys) v.clear();
    for (auto& v : run_counts) v.clear();
    for (auto& v : run_rows) v.clear();
    asked_ranged.clear();
    v1::TableSpec delta_table = table;
    delta_table.set_name("emb_delta");
    auto delta_ranged = (*ranged_writer)->WriteTableRuns(delta_table, 2, 3, next, true, &pool);
    ASSERT_TRUE(delta_ranged.ok()) << delta_ranged.status();
    for (auto& v : run_keys) v.clear();
    for (auto& v : run_counts) v.clear();
    for (auto& v : run_rows) v.clear();
    asked_ranged.clear();
    delta_table.set_name("emb_delta2");
    auto delta_one = (*ranged_writer)->WriteTableRuns(delta_table, 2, 3, next, true);
    ASSERT_TRUE(delta_one.ok()) << delta_one.status();
    EXPECT_EQ(delta_ranged->removed_keys(), 6);
    EXPECT_EQ(delta_ranged->removed_keys(), delta_one->removed_keys());
    EXPECT_EQ(delta_ranged->rows(), delta_one->rows());
    EXPECT_EQ(delta_ranged->bytes(), delta_one->bytes());
    ASSERT_TRUE((*ranged_writer)->Finish().ok());
    auto ranged_reader = CheckpointReader::Open(ranged_path + "/ps-0");
    ASSERT_TRUE(ranged_reader.ok()) << ranged_reader.status();
    auto want = (*reader)->ReadTableWhole(*saved, 2);
    auto got = (*ranged_reader)->ReadTableWhole(*ranged, 2);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->keys, want->keys);
    EXPECT_EQ(got->counts, want->counts);
    EXPECT_TRUE(std::equal(got->values.begin(), got->values.end(), want->values.begin(),
                           want->values.end()));
    auto delta_rows = (*ranged_reader)->ReadTableWhole(*delta_ranged, 2);
    ASSERT_TRUE(delta_rows.ok()) << delta_rows.status();
    EXPECT_EQ(delta_rows->keys, want->keys);
    auto removed = (*ranged_reader)->ReadTableRemoved(*delta_ranged);
    ASSERT_TRUE(removed.ok()) << removed.status();
    EXPECT_EQ(*removed, std::vector<int64_t>({50000, 100000, 50001, 100001, 50002, 100002}));
  }

  // A batch at a time (ReadTableBatches): the same rows in the same order as ReadTableWhole,
  // in batches of at least the size asked (but the last) and under it plus a block.
  auto whole = (*reader)->ReadTableWhole(*saved, 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  CheckpointReader::TableRows batched;
  std::vector<size_t> batch_sizes;
  const auto append = [&](CheckpointReader::TableRows& batch) {
    EXPECT_EQ(batch.stride, 2);
    batch_sizes.push_back(batch.keys.size());
    batched.keys.insert(batched.keys.end(), batch.keys.begin(), batch.keys.end());
    batched.counts.insert(batched.counts.end(), batch.counts.begin(), batch.counts.end());
    batched.values.insert(batched.values.end(), batch.values.begin(), batch.values.end());
    return absl::OkStatus();
  };
  ASSERT_TRUE((*reader)->ReadTableBatches(*saved, 2, 700, append).ok());
  EXPECT_EQ(batched.keys, whole->keys);
  EXPECT_EQ(batched.counts, whole->counts);
  EXPECT_TRUE(std::equal(batched.values.begin(), batched.values.end(), whole->values.begin(),
                         whole->values.end()));
  ASSERT_GE(batch_sizes.size(), 3u);
  for (size_t i = 0; i + 1 < batch_sizes.size(); ++i) {
    EXPECT_GE(batch_sizes[i], 700u);
    EXPECT_LT(batch_sizes[i], 700u + kRowBlock);
  }
  // The checksum fails only after the last record: the batches before it were handed over,
  // the last one is not, and the read is DATA_LOSS.
  v1::SavedShard bad_sum = *saved;
  bad_sum.set_checksum(saved->checksum() ^ 1);
  batch_sizes.clear();
  batched = CheckpointReader::TableRows();
  absl::Status s = (*reader)->ReadTableBatches(bad_sum, 2, 700, append);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("fails its checksum"));
  EXPECT_FALSE(batch_sizes.empty());
  EXPECT_LT(batched.keys.size(), 4000u);
  // Rows of another length: refused before any is handed over.
  batch_sizes.clear();
  s = (*reader)->ReadTableBatches(*saved, 3, 700, append);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("has rows of 2 floats"));
  EXPECT_TRUE(batch_sizes.empty());
  // More rows than the manifest says: refused once they pass its count.
  v1::SavedShard short_count = *saved;
  short_count.set_rows(1000);
  batch_sizes.clear();
  s = (*reader)->ReadTableBatches(short_count, 2, 700, append);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_LE(batch_sizes.size(), 1u);

  // In ranges of runs on a pool's threads (here one range a run, one of them empty): the same
  // rows, in batches from several threads, and the same refusals.
  ThreadPool pool(2);
  absl::Mutex mu;
  std::map<int64_t, std::pair<int64_t, std::vector<float>>> ranged;
  const auto collect = [&](CheckpointReader::TableRows& batch) {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(batch.stride, 2);
    for (size_t i = 0; i < batch.keys.size(); ++i) {
      ranged[batch.keys[i]] = {batch.counts[i], {batch.values[2 * i], batch.values[2 * i + 1]}};
    }
    return absl::OkStatus();
  };
  ASSERT_TRUE((*reader)->ReadTableBatches(*saved, 2, 700, collect, &pool).ok());
  ASSERT_EQ(ranged.size(), whole->keys.size());
  for (size_t i = 0; i < whole->keys.size(); ++i) {
    const auto& [count, row] = ranged.at(whole->keys[i]);
    EXPECT_EQ(count, whole->counts[i]);
    EXPECT_EQ(row, std::vector<float>({whole->values[2 * i], whole->values[2 * i + 1]}));
  }
  s = (*reader)->ReadTableBatches(bad_sum, 2, 700, collect, &pool);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("fails its checksum"));
  ranged.clear();
  s = (*reader)->ReadTableBatches(*saved, 3, 700, collect, &pool);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("has rows of 2 floats"));
  EXPECT_TRUE(ranged.empty());
  v1::SavedShard two_runs = *saved;
  two_runs.set_runs(2);
  s = (*reader)->ReadTableBatches(two_runs, 2, 700, collect, &pool);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("it is in run 2, expected 0 to 1"));

  v1::SavedShard fewer = *saved;
  fewer.set_runs(2);
  s = (*reader)->ReadTable(fewer, [](int64_t, const float*, int64_t) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("it is in run 2, expected 0 to 1"));
  v1::SavedShard none = *saved;
  none.set_runs(0);
  s = (*reader)->ReadTable(none, [](int64_t, const float*, int64_t) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("its key has 16 bytes, expected 14"));
}

// In a part of runs, keys increase within a run (not from one run to the next), and runs come
// in order.
TEST(CheckpointTest, MalformedRunsAreDataLoss) {
  v1::SavedShard saved;
  saved.set_name("emb");
  saved.set_is_table(true);
  saved.set_row_block(4);
  saved.set_runs(3);
  const std::string prefix = TablePartDecoder::Prefix(saved);
  auto block = [](std::vector<int64_t> keys) {
    const int64_t n = static_cast<int64_t>(keys.size());
    std::string value(8 + 16 * n, '\0');  // rows of no floats
    std::memcpy(value.data(), &n, 8);
    for (int64_t j = 0; j < n; ++j) std::memcpy(value.data() + 8 + 8 * j, &keys[j], 8);
    return value;
  };
  auto key = [&](int run, int64_t first) {
    uint64_t u = static_cast<uint64_t>(first) ^ (uint64_t{1} << 63);
    std::string k = prefix + std::string(10, '\0');
    k[prefix.size()] = static_cast<char>(run >> 8);
    k[prefix.size() + 1] = static_cast<char>(run & 0xff);
    for (int i = 7; i >= 0; --i, u >>= 8) k[prefix.size() + 2 + i] = static_cast<char>(u & 0xff);
    return k;
  };
  {
    TablePartDecoder decoder("ckpt-0000000001/ps-0", saved);
    EXPECT_TRUE(decoder.Add(key(0, 5), block({5, 9})).ok());
    EXPECT_TRUE(decoder.Add(key(1, 1), block({1, 2})).ok());  // a new run starts lower
    const absl::Status s = decoder.Add(key(1, 2), block({2}));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("key 2 after 2: keys must increase"));
  }
  {
    TablePartDecoder decoder("ckpt-0000000001/ps-0", saved);
    EXPECT_TRUE(decoder.Add(key(1, 5), block({5})).ok());
    const absl::Status s = decoder.Add(key(0, 7), block({7}));
    EXPECT_THAT(std::string(s.message()), HasSubstr("it is in run 0, expected 1 to 2"));
  }
  {
    TablePartDecoder decoder("ckpt-0000000001/ps-0", saved);
    const absl::Status s = decoder.Add(key(3, 7), block({7}));
    EXPECT_THAT(std::string(s.message()), HasSubstr("it is in run 3, expected 0 to 2"));
  }
}

// Found by fuzz/parameter_store_fuzzer (ASan): ParameterStore::Restore copied each row with the
// live table's stride, past the end of the rows of a table saved with a smaller dim.
TEST(CheckpointTest, TableRowsOfAnotherStrideAreDataLoss) {
  const std::string dir = Dir("stride");
  v1::CheckpointManifest m = Write(dir, 1);
  auto reader = CheckpointReader::Open(dir + "/ckpt-0000000001/ps-0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  int calls = 0;
  auto count = [&calls](int64_t, const float*, int64_t) { ++calls; };
  const absl::Status s = (*reader)->ReadTable(m.shards(1), count, /*stride=*/3);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("table emb has rows of 2 floats (values and optimizer slots), expected 3"));
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE((*reader)->ReadTable(m.shards(1), count, /*stride=*/2).ok());
  EXPECT_EQ(calls, 3);
}

// A table part's admission sketch and owned virtual shards: read back as written; a sketch
// whose bytes changed is DATA_LOSS naming the file and the table; a part without one reads as
// empty.
TEST(CheckpointTest, AdmissionSketchReadsBackAndIsChecked) {
  const std::string path = Dir("sketch") + "/ckpt-0000000005";
  auto writer = CheckpointWriter::Open(path, 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  v1::TableSpec table;
  table.set_name("emb");
  table.set_dim(1);
  auto with = (*writer)->WriteTable(table, {1}, {0.5f}, {PackRowCount(2, 7)}, 1);
  ASSERT_TRUE(with.ok()) << with.status();
  const std::vector<uint16_t> counters = {0, 1, 2, 65535, 258};
  ASSERT_TRUE((*writer)->WriteTableSketch(counters, {3, 9}, &*with).ok());
  table.set_name("plain");
  auto without = (*writer)->WriteTable(table, {1}, {0.5f}, {1}, 1);
  ASSERT_TRUE(without.ok()) << without.status();
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ(with->sketch_counters(), 5);
  EXPECT_THAT(with->virtual_shards(), ::testing::ElementsAre(3, 9));
  {
    auto reader = CheckpointReader::Open(path + "/ps-0");
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto sketch = (*reader)->ReadTableSketch(*with);
    ASSERT_TRUE(sketch.ok()) << sketch.status();
    EXPECT_EQ(*sketch, counters);
    auto none = (*reader)->ReadTableSketch(*without);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_TRUE(none->empty());
    // The row's word: update count 2, last push 7.
    ASSERT_TRUE((*reader)
                    ->ReadTable(*with,
                                [](int64_t, const float*, int64_t word) {
                                  EXPECT_EQ(UnpackRowCount(word), 2);
                                  EXPECT_EQ(UnpackRowLast(word), 7u);
                                })
                    .ok());
  }
  v1::SavedShard tampered = *with;
  tampered.set_sketch_checksum(with->sketch_checksum() ^ 1);
  v1::SavedShard longer = *with;
  longer.set_sketch_counters(6);
  auto reader = CheckpointReader::Open(path + "/ps-0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const auto& [saved, message] :
       {std::pair<v1::SavedShard, std::string>{tampered,
                                               "the admission sketch of table emb fails "
                                               "its checksum"},
        {longer, "has 10 bytes, the manifest says 6 2-byte counters"}}) {
    auto sketch = (*reader)->ReadTableSketch(saved);
    ASSERT_FALSE(sketch.ok());
    EXPECT_EQ(sketch.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(sketch.status().message()), HasSubstr(message));
    EXPECT_THAT(std::string(sketch.status().message()), HasSubstr("ps-0"));
  }
}

TEST(CheckpointTest, OnlyCommittedCheckpointsExistAndOldOnesArePruned) {
  const std::string dir = Dir("list");
  Write(dir, 10);
  Write(dir, 20);
  Write(dir, 30);
  // A crashed write: shards but no manifest.
  auto writer = CheckpointWriter::Open(dir + "/" + CheckpointDirName(25), 0);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto listed = ListCheckpoints(dir);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_THAT((*listed)[0], HasSubstr("ckpt-0000000030"));
  EXPECT_EQ(ReadManifest(dir + "/" + CheckpointDirName(25)).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(PruneCheckpoints(dir, 2).ok());
  listed = ListCheckpoints(dir);
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + CheckpointDirName(10)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + CheckpointDirName(25)));
}

// One checkpoint of a chain: table "emb" (dim 1, no slots) in two parts, ps-<i> holding
// rows[i] (key -> value; update count = value + 1) and, for a delta, removed[i].
struct ChainPart {
  std::map<int64_t, float> rows;
  std::vector<int64_t> removed;
};
v1::CheckpointManifest WriteChainLink(const std::string& dir, int64_t step,
                                      const std::vector<std::string>& chain,
                                      const std::vector<ChainPart>& parts, bool delta) {
  const std::string path = absl::StrCat(dir, "/", CheckpointDirName(step));
  v1::CheckpointManifest manifest;
  manifest.set_step(step);
  manifest.set_num_ps(static_cast<int32_t>(parts.size()));
  for (const std::string& name : chain) manifest.add_chain(name);
  v1::TableSpec table;
  table.set_name("emb");
  table.set_dim(1);
  for (size_t ps = 0; ps < parts.size(); ++ps) {
    auto writer = CheckpointWriter::Open(path, static_cast<int>(ps));
    CHECK(writer.ok()) << writer.status();
    std::vector<int64_t> keys, counts;
    std::vector<float> values;
    for (const auto& [key, value] : parts[ps].rows) {
      keys.push_back(key);
      counts.push_back(static_cast<int64_t>(value) + 1);
      values.push_back(value);
    }
    auto saved = (*writer)->WriteTable(table, keys, values, counts, 1);
    CHECK(saved.ok()) << saved.status();
    if (delta) CHECK((*writer)->WriteTableRemoved(parts[ps].removed, &*saved).ok());
    *manifest.add_shards() = *saved;
    CHECK((*writer)->Finish().ok());
  }
  CHECK(CommitManifest(path, manifest).ok());
  return manifest;
}

// The rows ReadTableChain gives for the chain ending at `path` (key -> value), checking each
// row's count.
absl::StatusOr<std::map<int64_t, float>> ReadChained(const std::string& path,
                                                     const std::function<bool(int64_t)>& keep) {
  PS_ASSIGN_OR_RETURN(const std::vector<ChainLink> chain, ReadChain(path));
  std::vector<TableLink> links;
  for (const ChainLink& link : chain) {
    TableLink& l = links.emplace_back();
    l.checkpoint_path = link.path;
    for (const v1::SavedShard& saved : link.manifest.shards()) l.parts.push_back(&saved);
  }
  CheckpointReaders readers;
  PS_ASSIGN_OR_RETURN(const CheckpointReader::TableRows rows,
                      ReadTableChain(links, 1, keep, &readers));
  std::map<int64_t, float> out;
  for (size_t i = 0; i < rows.keys.size(); ++i) {
    EXPECT_EQ(rows.counts[i], static_cast<int64_t>(rows.values[i]) + 1) << rows.keys[i];
    EXPECT_TRUE(out.emplace(rows.keys[i], rows.values[i]).second) << "key " << rows.keys[i];
  }
  return out;
}

// A full checkpoint and two deltas on it read as the last one: each delta's removed keys out
// (also keys it does not hold, and keys removed and given again), its rows over; with a filter,
// only the keys it accepts. Pruning keeps what the kept checkpoints build on. A broken chain,
// a removed-keys record that fails its checksum and a chain with no full checkpoint are
// DATA_LOSS naming what is wrong.
TEST(CheckpointTest, AChainOfDeltasReadsAsItsLastCheckpoint) {
  const std::string dir = Dir("chain");
  std::map<int64_t, float> full_ps0, full_ps1;
  for (int64_t k = 0; k < 20; ++k) (k % 2 == 0 ? full_ps0 : full_ps1)[k] = static_cast<float>(k);
  WriteChainLink(dir, 1, {}, {{full_ps0, {}}, {full_ps1, {}}}, /*delta=*/false);
  const std::string c1 = CheckpointDirName(1), c2 = CheckpointDirName(2);
  WriteChainLink(dir, 2, {c1}, {{{{0, 100}, {20, 120}}, {2, 4, 999}}, {{}, {1}}}, true);
  // Key 6 removed and given again in the same delta: the row stays.
  WriteChainLink(dir, 3, {c1, c2}, {{{{2, 202}, {6, 206}}, {0, 6}}, {{{3, 303}, {21, 321}}, {}}},
                 true);
  const std::string c3 = absl::StrCat(dir, "/", CheckpointDirName(3));
  std::map<int64_t, float> want;
  for (int64_t k = 0; k < 20; ++k) want[k] = static_cast<float>(k);
  for (int64_t k : {2, 4, 1}) want.erase(k);
  want[0] = 100;
  want[20] = 120;
  want.erase(0);
  want[2] = 202;
  want[6] = 206;
  want[3] = 303;
  want[21] = 321;
  auto got = ReadChained(c3, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  auto odd = ReadChained(c3, [](int64_t k) { return k % 2 != 0; });
  ASSERT_TRUE(odd.ok()) << odd.status();
  std::map<int64_t, float> want_odd;
  for (const auto& [k, v] : want) {
    if (k % 2 != 0) want_odd[k] = v;
  }
  EXPECT_EQ(*odd, want_odd);
  EXPECT_TRUE(VerifyCheckpoint(c3).ok());
  auto manifest = ReadManifest(c3);
  ASSERT_TRUE(manifest.ok());
  EXPECT_TRUE(manifest->shards(0).delta());
  EXPECT_EQ(manifest->shards(0).removed_keys(), 2);

  // The kept checkpoint's chain is kept; once a newer full one is the only one kept, it goes.
  ASSERT_TRUE(PruneCheckpoints(dir, 1).ok());
  EXPECT_EQ(ListCheckpoints(dir)->size(), 3u);
  WriteChainLink(dir, 4, {}, {{full_ps0, {}}, {full_ps1, {}}}, false);
  ASSERT_TRUE(PruneCheckpoints(dir, 1).ok());
  ASSERT_EQ(ListCheckpoints(dir)->size(), 1u);
  EXPECT_EQ(ReadChain(c3).status().code(), absl::StatusCode::kNotFound);

  // A delta whose chain is gone, or names its links out of order.
  const std::string broken = Dir("chain-broken");
  WriteChainLink(broken, 1, {}, {{full_ps0, {}}}, false);
  WriteChainLink(broken, 2, {c1}, {{{}, {0}}}, true);
  WriteChainLink(broken, 3, {c2, c1}, {{{}, {2}}}, true);
  absl::Status s = ReadChain(absl::StrCat(broken, "/", CheckpointDirName(3))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not on the 0 checkpoints before it"));
  std::filesystem::remove_all(absl::StrCat(broken, "/", c1));
  s = ReadChain(absl::StrCat(broken, "/", c2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("builds on " + c1 + ", which cannot be read"));
  EXPECT_EQ(VerifyCheckpoint(absl::StrCat(broken, "/", c2)).code(), absl::StatusCode::kDataLoss);

  // A removed-keys record that fails its checksum; a chain of deltas only.
  const std::string bad = Dir("chain-bad");
  v1::CheckpointManifest m = WriteChainLink(bad, 2, {}, {{{{5, 5}}, {7, 8}}}, true);
  auto reader = CheckpointReader::Open(absl::StrCat(bad, "/", c2, "/ps-0"));
  ASSERT_TRUE(reader.ok());
  auto removed = (*reader)->ReadTableRemoved(m.shards(0));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ::testing::ElementsAre(7, 8));
  v1::SavedShard wrong = m.shards(0);
  wrong.set_removed_checksum(wrong.removed_checksum() ^ 1);
  s = (*reader)->ReadTableRemoved(wrong).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("the removed keys of table emb fail their checksum"));
  wrong.set_removed_keys(3);
  s = (*reader)->ReadTableRemoved(wrong).status();
  EXPECT_THAT(s.message(), HasSubstr("are 2 keys, the manifest says 3"));
  s = ReadChained(absl::StrCat(bad, "/", c2), nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("holds it whole (the full checkpoint is missing)"));

  // A delta written in runs, as a ps task writes one: each run's removed keys, sorted, once
  // each, read back run after run.
  const std::string runs = absl::StrCat(Dir("chain-runs"), "/", c2);
  auto run_writer = CheckpointWriter::Open(runs, 0);
  ASSERT_TRUE(run_writer.ok());
  v1::TableSpec table;
  table.set_name("emb");
  table.set_dim(1);
  const std::vector<std::vector<int64_t>> removed_of = {{9, 3, 9, 5}, {}, {-4, 1}};
  std::vector<int64_t> keys;
  std::vector<int64_t> counts;
  std::vector<float> values;
  auto delta = (*run_writer)
                   ->WriteTableRuns(
                       table, 1, 3,
                       [&](int r) -> absl::StatusOr<CheckpointWriter::TableRun> {
                         keys = {100 + r};
                         counts = {1};
                         values = {static_cast<float>(r)};
                         return CheckpointWriter::TableRun{keys, counts, values, removed_of[r]};
                       },
                       /*delta=*/true);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_TRUE((*run_writer)->Finish().ok());
  EXPECT_TRUE(delta->delta());
  EXPECT_EQ(delta->removed_keys(), 5);
  run_writer->reset();
  auto run_reader = CheckpointReader::Open(runs + "/ps-0");
  ASSERT_TRUE(run_reader.ok());
  removed = (*run_reader)->ReadTableRemoved(*delta);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ::testing::ElementsAre(3, 5, 9, -4, 1));
}

TEST(CheckpointTest, EveryChiefGetsAHigherEpochThanTheOneBefore) {
  const std::string dir = Dir("epoch");
  EXPECT_EQ(*ReadChiefEpoch(dir), 0);  // none recorded yet
  EXPECT_EQ(*NextChiefEpoch(dir, 1000), 1000);
  EXPECT_EQ(*ReadChiefEpoch(dir), 1000);
  // A clock that went back does not lower it.
  EXPECT_EQ(*NextChiefEpoch(dir, 500), 1001);
  EXPECT_EQ(*NextChiefEpoch(dir, 5000), 5000);
  EXPECT_EQ(ListCheckpoints(dir)->size(), 0u);  // not a checkpoint
  std::ofstream(dir + "/CHIEF_EPOCH") << "garbage";
  absl::StatusOr<int64_t> bad = NextChiefEpoch(dir, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("CHIEF_EPOCH does not hold a number"));
}

TEST(CheckpointTest, LaterCheckpointsOfTheSameStepListAsNewer) {
  const std::string dir = Dir("sequence");
  Write(dir, 10);
  const std::string base = dir + "/" + CheckpointDirName(10);
  std::filesystem::rename(base, base + "-moved");
  Write(dir, 10);  // ckpt-0000000010 again
  std::filesystem::rename(base, dir + "/" + CheckpointDirName(10, 2));
  std::filesystem::rename(base + "-moved", dir + "/" + CheckpointDirName(10, 1));
  Write(dir, 10);
  Write(dir, 9);
  EXPECT_EQ(CheckpointDirName(10, 2), "ckpt-0000000010.2");
  auto listed = ListCheckpoints(dir);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 4u);
  EXPECT_THAT((*listed)[0], ::testing::EndsWith("ckpt-0000000010.2"));
  EXPECT_THAT((*listed)[1], ::testing::EndsWith("ckpt-0000000010.1"));
  EXPECT_THAT((*listed)[2], ::testing::EndsWith("ckpt-0000000010"));
  EXPECT_THAT((*listed)[3], ::testing::EndsWith("ckpt-0000000009"));
  // Names that only look like checkpoints are not listed.
  std::filesystem::create_directories(dir + "/ckpt-0000000011.x");
  std::filesystem::create_directories(dir + "/ckpt-0000000011.0");
  EXPECT_EQ(ListCheckpoints(dir)->size(), 4u);
  ASSERT_TRUE(PruneCheckpoints(dir, 2).ok());
  listed = ListCheckpoints(dir);
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_THAT((*listed)[1], ::testing::EndsWith("ckpt-0000000010.1"));
}

TEST(CheckpointTest, TheRecoveryIntentIsWrittenReadAndClearedBesideTheCheckpoints) {
  const std::string dir = Dir("intent");
  EXPECT_EQ(ReadRecoveryIntent(dir).status().code(), absl::StatusCode::kNotFound);
  Write(dir, 40);
  v1::RecoveryIntent intent;
  intent.set_checkpoint_path(dir + "/" + CheckpointDirName(40));
  intent.set_checkpoint_step(40);
  intent.set_step_before(57);
  intent.add_restarted("ps:1");
  ASSERT_TRUE(WriteRecoveryIntent(dir, intent).ok());
  // A second write replaces the first whole.
  intent.add_restarted("ps:0");
  ASSERT_TRUE(WriteRecoveryIntent(dir, intent).ok());
  absl::StatusOr<v1::RecoveryIntent> read = ReadRecoveryIntent(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->checkpoint_step(), 40);
  EXPECT_EQ(read->step_before(), 57);
  EXPECT_EQ(read->restarted_size(), 2);
  EXPECT_FALSE(std::filesystem::exists(dir + "/RECOVERY.json.tmp"));
  // The record is not a checkpoint, and pruning leaves it alone.
  ASSERT_EQ(ListCheckpoints(dir)->size(), 1u);
  ASSERT_TRUE(PruneCheckpoints(dir, 1).ok());
  EXPECT_TRUE(ReadRecoveryIntent(dir).ok());
  ASSERT_TRUE(ClearRecoveryIntent(dir).ok());
  EXPECT_EQ(ReadRecoveryIntent(dir).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(ClearRecoveryIntent(dir).ok());  // clearing twice is fine
  // A torn or foreign file is DATA_LOSS, naming it, not an empty intent.
  std::ofstream(dir + "/RECOVERY.json") << "{\"checkpoint_step\": ";
  absl::StatusOr<v1::RecoveryIntent> torn = ReadRecoveryIntent(dir);
  EXPECT_EQ(torn.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(torn.status().message(), HasSubstr("RECOVERY.json"));
}

TEST(CheckpointTest, ACorruptedShardFileIsDataLossNamingTheFile) {
  const std::string dir = Dir("corrupt");
  v1::CheckpointManifest m = Write(dir, 5);
  const std::string path = dir + "/" + CheckpointDirName(5);
  // Flip bytes in the middle of every table file of the shard's RocksDB.
  int corrupted = 0;
  for (const auto& f : std::filesystem::directory_iterator(path + "/ps-0")) {
    if (f.path().extension() != ".sst") continue;
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(0, std::ios::end);
    const std::streamoff size = file.tellg();
    for (std::streamoff at = 0; at < size / 2; at += 7) {
      file.seekp(at);
      file.put('\x5a');
    }
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  absl::Status s = VerifyCheckpoint(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path + "/ps-0"));

  // A manifest whose checksum disagrees with intact data is caught too.
  const std::string dir2 = Dir("badsum");
  v1::CheckpointManifest m2 = Write(dir2, 6);
  m2.mutable_shards(0)->set_checksum(m2.shards(0).checksum() ^ 1);
  auto reader = CheckpointReader::Open(dir2 + "/" + CheckpointDirName(6) + "/ps-0");
  ASSERT_TRUE(reader.ok());
  auto dense = (*reader)->ReadDense(m2.shards(0));
  EXPECT_EQ(dense.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(dense.status().message()), HasSubstr("w/1 fails its checksum"));
}

// A process killed at any point of writing a checkpoint leaves the committed ones intact and
// never a half checkpoint that lists or restores. Each write runs in a forked child that
// really dies of SIGKILL at the point.
// Found by fuzz/parameter_store_fuzzer (UBSan, bazel test --config=asan): saving a shard with
// no elements passed memcpy a null source.
TEST(CheckpointTest, AnEmptyDensePartitionWritesAndReadsBack) {
  const std::string path = Dir("empty") + "/" + CheckpointDirName(1);
  auto writer = CheckpointWriter::Open(path, 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  v1::DenseShardSpec spec = Spec();
  spec.mutable_partition()->set_row_begin(3);  // rows [3, 3): no elements
  auto saved = (*writer)->WriteDense(spec, 5, {});
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE((*writer)->Finish().ok());
  writer->reset();
  auto reader = CheckpointReader::Open(absl::StrCat(path, "/", saved->file()));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto record = (*reader)->ReadDense(*saved);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->updates, 5);
  EXPECT_TRUE(record->values_and_slots.empty());
}

// Found by fuzz/shard_record_fuzzer: a table row whose value was an update count and 11.25
// floats was read as 11 floats, the rest dropped, instead of being refused.
TEST(CheckpointTest, ATableRowOfPartialFloatsIsDataLoss) {
  v1::SavedShard saved;
  saved.set_name("emb");
  saved.set_is_table(true);
  const std::string prefix = TablePartDecoder::Prefix(saved);
  EXPECT_EQ(prefix, "t/emb/");
  const std::string key = prefix + std::string(8, '\x80');
  TablePartDecoder decoder("ckpt/ps-0", saved);
  const absl::Status s = decoder.Add(key, std::string(8 + 4 * 2 + 1, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("checkpoint file ckpt/ps-0: table emb has a malformed row: 17 bytes, "
                        "expected an 8-byte update count and whole float32s"));
  TablePartDecoder short_key("ckpt/ps-0", saved);
  EXPECT_THAT(std::string(short_key.Add(prefix + "1234567", std::string(8, '\0')).message()),
              HasSubstr("its key has 13 bytes, expected 14"));
}

// A checkpoint written before blocks of rows (one record per row, no row_block in its
// manifest) still reads back through CheckpointReader, rows in key order.
TEST(CheckpointTest, APartOfOneRowPerRecordStillReads) {
  const std::string path = Dir("rows") + "/ckpt-0000000002";
  std::filesystem::create_directories(path);
  v1::SavedShard saved;
  saved.set_name("emb");
  saved.set_is_table(true);
  saved.set_file("ps-0");
  const std::string prefix = TablePartDecoder::Prefix(saved);
  {
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, path + "/ps-0", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    uLong crc = 0;
    for (int64_t key : {-7, 2, 40}) {
      uint64_t u = static_cast<uint64_t>(key) ^ (uint64_t{1} << 63);
      std::string k = prefix + std::string(8, '\0');
      for (int i = 7; i >= 0; --i, u >>= 8) k[prefix.size() + i] = static_cast<char>(u & 0xff);
      std::string v(8 + 4, '\0');
      const int64_t count = key + 100;
      const float row = key * 0.5f;
      std::memcpy(v.data(), &count, 8);
      std::memcpy(v.data() + 8, &row, 4);
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), k, v).ok());
      crc = crc32(crc, reinterpret_cast<const Bytef*>(k.data()), k.size());
      crc = crc32(crc, reinterpret_cast<const Bytef*>(v.data()), v.size());
    }
    saved.set_checksum(static_cast<uint32_t>(crc));
    saved.set_rows(3);
    ASSERT_TRUE(db->Close().ok());
  }
  auto reader = CheckpointReader::Open(path + "/ps-0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> keys, counts;
  std::vector<float> rows;
  ASSERT_TRUE((*reader)
                  ->ReadTable(saved,
                              [&](int64_t key, const float* row, int64_t t) {
                                keys.push_back(key);
                                counts.push_back(t);
                                rows.push_back(row[0]);
                              })
                  .ok());
  EXPECT_THAT(keys, ::testing::ElementsAre(-7, 2, 40));
  EXPECT_THAT(counts, ::testing::ElementsAre(93, 102, 140));
  EXPECT_THAT(rows, ::testing::ElementsAre(-3.5f, 1.0f, 20.0f));
}

TEST(CheckpointTest, RecordsDecodeApartFromRocksDb) {
  v1::SavedShard saved;
  saved.set_name("emb");
  saved.set_is_table(true);
  saved.set_rows(2);
  const std::string prefix = TablePartDecoder::Prefix(saved);
  std::string row(8 + 4, '\0');
  row[0] = 3;
  const std::string k1 = prefix + std::string("\x80\0\0\0\0\0\0\x01", 8);
  const std::string k2 = prefix + std::string("\x80\0\0\0\0\0\0\x02", 8);
  uLong crc = crc32(0, reinterpret_cast<const Bytef*>(k1.data()), k1.size());
  crc = crc32(crc, reinterpret_cast<const Bytef*>(row.data()), row.size());
  crc = crc32(crc, reinterpret_cast<const Bytef*>(k2.data()), k2.size());
  crc = crc32(crc, reinterpret_cast<const Bytef*>(row.data()), row.size());
  saved.set_checksum(static_cast<uint32_t>(crc));
  TablePartDecoder decoder("ckpt/ps-0", saved);
  ASSERT_TRUE(decoder.Add(k1, row).ok());
  ASSERT_TRUE(decoder.Add(k2, row).ok());
  std::vector<int64_t> keys;
  ASSERT_TRUE(decoder
                  .Finish([&](int64_t key, const float*, int64_t t, int64_t stride) {
                    EXPECT_EQ(t, 3);
                    EXPECT_EQ(stride, 1);
                    keys.push_back(key);
                  })
                  .ok());
  EXPECT_EQ(keys, (std::vector<int64_t>{1, 2}));

  v1::SavedShard dense;
  dense.set_name("w");
  dense.set_checksum(1);
  const absl::StatusOr<DenseRecord> bad = DecodeDenseRecord("ckpt/ps-0", dense, "d/w/0", row);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("checkpoint file ckpt/ps-0: w/0 fails its checksum"));
}

TEST(CheckpointTest, AManifestParsesFromBytes) {
  absl::StatusOr<v1::CheckpointManifest> m =
      ParseManifest(R"({"step": "12", "num_ps": 2, "shards": [{"name": "w", "file": "ps-1"}]})",
                    "ckpt/MANIFEST.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step(), 12);
  EXPECT_EQ(m->shards(0).file(), "ps-1");
  absl::StatusOr<v1::CheckpointManifest> bad = ParseManifest("{\"step\": ", "ckpt/MANIFEST.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("committed manifest ckpt/MANIFEST.json does not parse"));
}

TEST(CheckpointDeathTest, AKillAtAnyPointOfAWriteLeavesOnlyWholeCheckpoints) {
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  const struct {
    const char* point;
    bool committed;  // the new checkpoint exists after the crash
  } kCases[] = {
      {kCrashSaveOpened, false},           {kCrashSaveMidway, false},
      {kCrashSaveBeforeSync, false},       {kCrashSaveDone, false},
      {kCrashManifestBeforeWrite, false},  {kCrashManifestBeforeRename, false},
      {kCrashManifestBeforeDirSync, true},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.point);
    const std::string dir = Dir(absl::StrCat("crash-", c.point));
    Write(dir, 10);
    auto write_and_crash = [&dir, point = c.point]() {
      auto crash = CrashPoints::Parse(point);
      CHECK(crash.ok());
      Write(dir, 20, crash->get());
      std::exit(0);  // not reached: the point kills the child
    };
    EXPECT_EXIT(write_and_crash(), ::testing::KilledBySignal(SIGKILL),
                absl::StrCat("crash point ", c.point, "@1 reached"));
    auto listed = ListCheckpoints(dir);
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), c.committed ? 2u : 1u);
    for (const std::string& path : *listed) EXPECT_TRUE(VerifyCheckpoint(path).ok()) << path;
    EXPECT_THAT(listed->back(), HasSubstr(CheckpointDirName(10)));
    if (!c.committed) {
      EXPECT_EQ(ReadManifest(dir + "/" + CheckpointDirName(20)).status().code(),
                absl::StatusCode::kNotFound);
      // The next write of the same step starts over (the chief clears the leftovers first).
      std::filesystem::remove_all(dir + "/" + CheckpointDirName(20));
      Write(dir, 20);
      EXPECT_TRUE(VerifyCheckpoint(dir + "/" + CheckpointDirName(20)).ok());
    }
  }
}

}  // namespace
}  // namespace pscluster
