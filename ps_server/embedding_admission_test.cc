// Admission and eviction of embedding-table rows (model.proto's AdmissionSpec, EvictionSpec).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"
#include "ps_server/embedding_table.h"
#include "ps_server/initializer.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::TableSpec ParseTable(const std::string& text) {
  v1::TableSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

// SGD with learning rate 1 from constant 0.5: a row pushed with gradient g holds 0.5 - g.
std::unique_ptr<EmbeddingTable> Table(const std::string& extra, int64_t dim = 1) {
  const std::string text = absl::StrCat(
      "name: \"emb\" dim: ", dim,
      " initializer { kind: CONSTANT value: 0.5 } optimizer { sgd { learning_rate: 1 } } ", extra);
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> table =
      EmbeddingTable::Create(ParseTable(text), {0}, 1);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

std::vector<float> Pull(EmbeddingTable& table, const std::vector<int64_t>& keys) {
  std::vector<float> out(keys.size() * table.dim(), -1.0f);
  absl::Status status = table.Pull(keys.data(), static_cast<int64_t>(keys.size()), out.data());
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

void Push(EmbeddingTable& table, const std::vector<int64_t>& keys, float grad = 0.125f) {
  std::vector<float> grads(keys.size() * table.dim(), grad);
  absl::Status status =
      table.Push(keys.data(), static_cast<int64_t>(keys.size()), grads.data(), false);
  EXPECT_TRUE(status.ok()) << status;
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> keys;
  for (int64_t k = begin; k < end; ++k) keys.push_back(k);
  return keys;
}

// Keys of `keys` that have a row.
std::vector<int64_t> Resident(const EmbeddingTable& table, const std::vector<int64_t>& keys) {
  std::vector<int64_t> found, missing;
  std::vector<float> rows;
  table.Lookup(keys.data(), static_cast<int64_t>(keys.size()), &found, &rows, &missing);
  std::sort(found.begin(), found.end());
  return found;
}

TEST(AdmissionTest, AKeyGetsARowAtItsMinCountthPushAndIsPulledAsItsInitialValuesBefore) {
  std::unique_ptr<EmbeddingTable> table = Table("admission { min_count: 3 }");
  ASSERT_NE(table, nullptr);
  // Pulls give the initial value and create nothing.
  EXPECT_THAT(Pull(*table, {7, 8}), ElementsAre(0.5f, 0.5f));
  EXPECT_EQ(table->num_rows(), 0);
  // Two pushes are counted and dropped; a key named twice in one push counts once.
  Push(*table, {7, 7});
  Push(*table, {7});
  EXPECT_EQ(table->num_rows(), 0);
  EXPECT_THAT(Pull(*table, {7}), ElementsAre(0.5f));
  // The third admits it and is applied.
  Push(*table, {7});
  EXPECT_EQ(table->num_rows(), 1);
  EXPECT_THAT(Pull(*table, {7, 8}), ElementsAre(0.375f, 0.5f));
  Push(*table, {7});
  EXPECT_THAT(Pull(*table, {7}), ElementsAre(0.25f));
  const EmbeddingTable::Counts counts = table->counts();
  EXPECT_EQ(counts.admitted, 1);
  EXPECT_EQ(counts.unadmitted, 2);
  EXPECT_EQ(counts.evicted, 0);
}

TEST(AdmissionTest, ProbabilityAdmitsAboutThatShareAndTheSameKeysEveryTime) {
  const std::string spec = "admission { min_count: 65535 probability: 0.25 }";
  std::unique_ptr<EmbeddingTable> a = Table(spec), b = Table(spec);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<int64_t> keys = Range(0, 20000);
  Push(*a, keys);
  // The same pushes in another order, split differently.
  Push(*b, Range(10000, 20000));
  Push(*b, Range(0, 10000));
  EXPECT_GT(a->num_rows(), 4500);  // 5000 expected; the standard deviation is 61
  EXPECT_LT(a->num_rows(), 5500);
  EXPECT_EQ(Resident(*a, keys), Resident(*b, keys));
  EXPECT_EQ(a->counts().unadmitted, 20000 - a->num_rows());
  // A key's second push has another chance.
  Push(*a, keys);
  EXPECT_GT(a->num_rows(), 8000);  // 1 - 0.75^2 = 0.4375 of them
}

// A table given another's sketch (as a restore does) admits what the other would.
TEST(AdmissionTest, AMergedSketchCarriesTheCounts) {
  const std::string spec = "admission { min_count: 2 sketch_width: 65536 }";
  std::unique_ptr<EmbeddingTable> a = Table(spec), b = Table(spec), c = Table(spec);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  Push(*a, Range(0, 1000));  // counted once each
  const std::vector<uint16_t> sketch = a->AdmissionSketch();
  EXPECT_EQ(static_cast<int64_t>(sketch.size()), a->admission_sketch_size());
  ASSERT_TRUE(b->MergeAdmissionSketch(sketch).ok());
  EXPECT_EQ(b->AdmissionSketch(), sketch);
  Push(*a, Range(0, 1000));  // the second push admits them, in a
  Push(*b, Range(0, 1000));  // and in b
  Push(*c, Range(0, 1000));  // not in c, which never counted them (a few collide)
  EXPECT_EQ(a->num_rows(), 1000);
  EXPECT_EQ(b->num_rows(), 1000);
  EXPECT_LT(c->num_rows(), 20);
  // A sketch of another width is refused, changing nothing.
  std::unique_ptr<EmbeddingTable> narrow = Table("admission { min_count: 2 }");
  ASSERT_NE(narrow, nullptr);
  const absl::Status s = narrow->MergeAdmissionSketch(sketch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("was admission.sketch_width changed?"));
}

// The keys of one push are admitted from the sketch as it was before the push, so their order
// does not matter, even with a sketch so small that their counters collide.
TEST(AdmissionTest, TheOrderOfAPushsKeysDoesNotChangeWhatIsAdmitted) {
  const std::string spec = "admission { min_count: 2 sketch_width: 4096 }";
  std::unique_ptr<EmbeddingTable> a = Table(spec), b = Table(spec);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // The same first push to both: about 47 keys per stripe on 64 counters a sketch row.
  Push(*a, Range(0, 3000));
  Push(*b, Range(0, 3000));
  EXPECT_EQ(a->num_rows(), 0);  // decided on the empty sketch
  // New keys, in opposite orders: admitted where all four counters were already counted.
  const std::vector<int64_t> keys = Range(3000, 6000);
  const std::vector<int64_t> reversed(keys.rbegin(), keys.rend());
  Push(*a, keys);
  Push(*b, reversed);
  EXPECT_GT(a->num_rows(), 30);
  EXPECT_LT(a->num_rows(), 1500);
  EXPECT_EQ(Resident(*a, keys), Resident(*b, keys));
  EXPECT_EQ(a->AdmissionSketch(), b->AdmissionSketch());
}

// A row past its TTL that its stripe has not swept yet behaves as one it has: with admission,
// the key is admitted again (or not) by the same draw either way.
TEST(AdmissionTest, AnExpiredRowIsAdmittedAgainWhetherOrNotItWasSwept) {
  const std::string spec =
      "admission { min_count: 65535 probability: 0.5 } eviction { ttl_steps: 4 }";
  std::unique_ptr<EmbeddingTable> swept = Table(spec), unswept = Table(spec);
  ASSERT_NE(swept, nullptr);
  ASSERT_NE(unswept, nullptr);
  const std::vector<int64_t> keys = Range(0, 2000);
  for (EmbeddingTable* t : {swept.get(), unswept.get()}) {
    t->ObserveStep(0);
    for (int i = 0; i < 3; ++i) Push(*t, keys);
    t->ObserveStep(10);
  }
  const int64_t before = swept->num_rows();
  EXPECT_GT(before, 1500);  // 1 - 0.5^3 of them
  // Other keys, pushed to one table only, make every stripe of it sweep the expired rows.
  Push(*swept, Range(100000, 101000));
  EXPECT_LT(swept->num_rows(), 1000);              // only some of the other keys
  EXPECT_EQ(unswept->num_rows(), before);          // still held, though expired
  EXPECT_EQ(Resident(*unswept, keys).size(), 0u);  // and seen as removed
  Push(*swept, keys);
  Push(*unswept, keys);
  EXPECT_EQ(Resident(*swept, keys), Resident(*unswept, keys));
  EXPECT_EQ(Pull(*swept, keys), Pull(*unswept, keys));
  EXPECT_GT(Resident(*swept, keys).size(), 600u);  // about half
  EXPECT_LT(Resident(*swept, keys).size(), 1400u);
}

// Ticks saved by a table without eviction, or in another unit, are not this table's.
TEST(EvictionTest, SavedTicksAreComparableOnlyInTheSameUnit) {
  std::unique_ptr<EmbeddingTable> steps = Table("eviction { ttl_steps: 10 }");
  ASSERT_NE(steps, nullptr);
  EXPECT_TRUE(steps->TicksComparable(ParseTable("eviction { ttl_steps: 99 }")));
  EXPECT_TRUE(steps->TicksComparable(ParseTable("eviction { max_rows: 99 }")));
  EXPECT_FALSE(steps->TicksComparable(ParseTable("eviction { ttl_seconds: 99 }")));
  EXPECT_FALSE(steps->TicksComparable(ParseTable("name: \"emb\"")));
  EXPECT_EQ(steps->TickOf(1234), 1234u);
}

TEST(EvictionTest, ARowPastItsTtlIsPulledAsInitialRestartsOnPushAndIsSweptAway) {
  std::unique_ptr<EmbeddingTable> table = Table("eviction { ttl_steps: 10 }");
  ASSERT_NE(table, nullptr);
  table->ObserveStep(0);
  Push(*table, {1, 2});
  table->ObserveStep(5);
  Push(*table, {2});
  table->ObserveStep(11);  // key 1 was last pushed 11 steps ago, key 2 six
  EXPECT_THAT(Pull(*table, {1, 2}), ElementsAre(0.5f, 0.25f));
  EXPECT_THAT(Resident(*table, {1, 2}), ElementsAre(2));
  Push(*table, {1});  // starts again from the initial value
  EXPECT_THAT(Pull(*table, {1}), ElementsAre(0.375f));
  EXPECT_EQ(table->counts().expired, 1);

  // 1000 rows pushed at step 11, then 1000 others at step 30: every stripe is swept, and only
  // the second thousand (and nothing older) is left.
  Push(*table, Range(100, 1100));
  table->ObserveStep(30);
  Push(*table, Range(2000, 3000));
  EXPECT_EQ(table->num_rows(), 1000);
  EXPECT_EQ(Resident(*table, Range(0, 3000)), Range(2000, 3000));
}

TEST(EvictionTest, PullsCreateNoRowsAndOnlyPushesMoveTheClock) {
  std::unique_ptr<EmbeddingTable> table = Table("eviction { ttl_steps: 10 }");
  ASSERT_NE(table, nullptr);
  std::vector<float> out(2);
  const std::vector<int64_t> keys = {1, 2};
  ASSERT_TRUE(table->Pull(keys.data(), 2, out.data()).ok());
  EXPECT_THAT(out, ElementsAre(0.5f, 0.5f));
  EXPECT_EQ(table->num_rows(), 0);
  table->ObserveStep(4);
  Push(*table, {1});
  // A mean applied at an explicit step (a sync step's) is judged and stamped at that step,
  // whatever the clock says.
  ASSERT_TRUE(
      table->ApplyPush(keys.data(), 1, std::vector<float>{0.125f}.data(), nullptr, 12).ok());
  std::map<int64_t, uint32_t> last;
  table->ForEachRow([&](int64_t key, const float*, int64_t, uint32_t l) { last[key] = l; });
  EXPECT_EQ(last, (std::map<int64_t, uint32_t>{{1, 12}}));
  EXPECT_THAT(Pull(*table, {1}), ElementsAre(0.25f));
  // At step 20 (the clock: pushes only), the row last pushed at 12 is alive; at 23 it is not.
  table->ObserveStep(20);
  EXPECT_THAT(Pull(*table, {1}), ElementsAre(0.25f));
  table->ObserveStep(23);
  EXPECT_THAT(Pull(*table, {1}), ElementsAre(0.5f));
  EXPECT_EQ(table->num_rows(), 1);  // not swept yet: no push since
  // A pull for an explicit step (a sync step's) is judged at that step instead.
  ASSERT_TRUE(table->Pull(keys.data(), 1, out.data(), nullptr, /*step=*/21).ok());
  EXPECT_EQ(out[0], 0.25f);
}

TEST(EvictionTest, LruCapacityKeepsTheMostRecentlyPushedRows) {
  // 1024 rows: 16 per stripe.
  std::unique_ptr<EmbeddingTable> table = Table("eviction { max_rows: 1024 }");
  ASSERT_NE(table, nullptr);
  for (int step = 0; step < 20; ++step) {
    table->ObserveStep(step);
    Push(*table, Range(step * 100, step * 100 + 100));
    EXPECT_LE(table->num_rows(), 1024) << step;
  }
  EXPECT_EQ(Resident(*table, Range(1900, 2000)).size(), 100u);  // the last push's rows
  EXPECT_TRUE(Resident(*table, Range(0, 100)).empty());         // the first push's rows
  const EmbeddingTable::Counts counts = table->counts();
  EXPECT_EQ(counts.admitted, 2000);
  EXPECT_EQ(counts.evicted, 2000 - table->num_rows());
  // An evicted key starts again from its initial value.
  EXPECT_THAT(Pull(*table, {0}), ElementsAre(0.5f));
}

TEST(EvictionTest, LfuCapacityKeepsTheMostUpdatedRows) {
  std::unique_ptr<EmbeddingTable> table = Table("eviction { max_rows: 1024 policy: LFU }");
  ASSERT_NE(table, nullptr);
  const std::vector<int64_t> hot = Range(0, 100);
  for (int i = 0; i < 5; ++i) Push(*table, hot);
  for (int step = 1; step <= 20; ++step) {
    table->ObserveStep(step);
    Push(*table, Range(step * 1000, step * 1000 + 100));  // each pushed once
  }
  EXPECT_LE(table->num_rows(), 1024);
  EXPECT_EQ(Resident(*table, hot), hot);
  EXPECT_THAT(Pull(*table, {0}), ElementsAre(0.5f - 5 * 0.125f));
}

TEST(EvictionTest, MaxBytesBoundsTheRowsBytes) {
  // dim 8, SGD: 32 bytes of values, a 16-byte index entry and 4 bytes of last push.
  std::unique_ptr<EmbeddingTable> table = Table("eviction { max_bytes: 65536 }", 8);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->row_bytes(), 52);
  Push(*table, Range(0, 5000));
  EXPECT_LE(table->bytes(), 65536);
  EXPECT_GT(table->bytes(), 65536 * 3 / 4);
}

// The rows a table evicts depend on what it holds, not on the order the rows were inserted in:
// a table restored (in another order) from another's rows keeps the same rows as the original
// through the same pushes.
TEST(EvictionTest, ARestoredTableEvictsAsTheOriginalDoes) {
  for (const std::string policy : {"LRU", "LFU"}) {
    const std::string spec = absl::StrCat("eviction { max_rows: 2048 policy: ", policy, " }");
    std::unique_ptr<EmbeddingTable> original = Table(spec, 2), restored = Table(spec, 2);
    ASSERT_NE(original, nullptr);
    ASSERT_NE(restored, nullptr);
    for (int step = 0; step < 10; ++step) {
      original->ObserveStep(step);
      Push(*original, Range(step * 150, step * 150 + 200), 0.01f * step);
    }
    struct Row {
      int64_t key;
      std::vector<float> data;
      int64_t t;
      uint32_t last;
    };
    std::vector<Row> rows;
    original->ForEachRow([&](int64_t key, const float* data, int64_t t, uint32_t last) {
      rows.push_back({key, std::vector<float>(data, data + 2), t, last});
    });
    std::reverse(rows.begin(), rows.end());
    restored->Clear();
    for (const Row& r : rows)
      ASSERT_TRUE(restored->InsertRow(r.key, r.data.data(), r.t, r.last).ok());
    for (int step = 10; step < 16; ++step) {
      for (EmbeddingTable* t : {original.get(), restored.get()}) {
        t->ObserveStep(step);
        Push(*t, Range(step * 150 + 7, step * 150 + 407), 0.02f);
      }
    }
    std::map<int64_t, std::tuple<std::vector<float>, int64_t, uint32_t>> a, b;
    original->ForEachRow([&](int64_t key, const float* data, int64_t t, uint32_t last) {
      a[key] = {std::vector<float>(data, data + 2), t, last};
    });
    restored->ForEachRow([&](int64_t key, const float* data, int64_t t, uint32_t last) {
      b[key] = {std::vector<float>(data, data + 2), t, last};
    });
    EXPECT_GT(original->counts().evicted, 0) << policy;
    EXPECT_EQ(a, b) << policy;
  }
}

TEST(EvictionTest, ForEachRowGivesTheLastPushStep) {
  std::unique_ptr<EmbeddingTable> table = Table("eviction { ttl_steps: 100 }");
  ASSERT_NE(table, nullptr);
  table->ObserveStep(3);
  Push(*table, {1, 2});
  table->ObserveStep(8);
  Push(*table, {2});
  table->ObserveStep(4);  // the clock never goes back
  Push(*table, {3});
  std::map<int64_t, uint32_t> last;
  table->ForEachRow([&](int64_t key, const float*, int64_t, uint32_t l) { last[key] = l; });
  EXPECT_EQ(last, (std::map<int64_t, uint32_t>{{1, 3}, {2, 8}, {3, 8}}));
}

// A checkpoint's cut copies the rows with CopyRows: the same rows, counts, ticks and floats as
// ForEachRow gives, rows past their TTL left out by both, appended after what the copy held.
TEST(EvictionTest, CopyRowsGivesWhatForEachRowGives) {
  using Rows = std::map<int64_t, std::tuple<std::vector<float>, int64_t, uint32_t>>;
  for (const std::string spec : {"eviction { ttl_steps: 5 }", "", "admission { min_count: 2 }"}) {
    std::unique_ptr<EmbeddingTable> table = Table(spec, 3);
    ASSERT_NE(table, nullptr);
    for (int step = 0; step < 12; ++step) {
      table->ObserveStep(step);
      Push(*table, Range(step * 40, step * 40 + 300), 0.01f * step);
    }
    const size_t stride = 3 * (1 + table->optimizer().num_slots());
    Rows want, got;
    table->ForEachRow([&](int64_t key, const float* data, int64_t t, uint32_t last) {
      want[key] = {std::vector<float>(data, data + stride), t, last};
    });
    EmbeddingTable::RowsCopy copy;
    copy.keys = {-1};
    copy.counts = {7};
    copy.last = {9};
    copy.rows.assign(stride, 2.0f);
    table->CopyRows(&copy);
    ASSERT_EQ(copy.keys.size(), want.size() + 1) << spec;
    ASSERT_EQ(copy.counts.size(), copy.keys.size());
    ASSERT_EQ(copy.last.size(), copy.keys.size());
    ASSERT_EQ(copy.rows.size(), copy.keys.size() * stride);
    EXPECT_EQ(copy.keys[0], -1);
    EXPECT_EQ(copy.rows[stride - 1], 2.0f);
    for (size_t i = 1; i < copy.keys.size(); ++i) {
      const float* row = &copy.rows[i * stride];
      got[copy.keys[i]] = {std::vector<float>(row, row + stride), copy.counts[i], copy.last[i]};
    }
    EXPECT_EQ(got, want) << spec;
    EXPECT_GT(want.size(), 0u) << spec;
    if (spec == "eviction { ttl_steps: 5 }") {
      EXPECT_LT(static_cast<int64_t>(want.size()), table->num_rows() + 1);  // expired left out
      EXPECT_FALSE(want.count(0));
    }
  }
}

// A cut's rows by key: values and slots, update count, last-push tick.
using Rows = std::map<int64_t, std::tuple<std::vector<float>, int64_t, uint32_t>>;

// Adds the rows of `copy` (of `stride` floats) to *rows; a key given twice is a failure.
void RowsOf(const EmbeddingTable::RowsCopy& copy, size_t stride, Rows* rows) {
  for (size_t i = 0; i < copy.keys.size(); ++i) {
    const float* row = &copy.rows[i * stride];
    const bool fresh =
        rows->emplace(copy.keys[i], std::make_tuple(std::vector<float>(row, row + stride),
                                                    copy.counts[i], copy.last[i]))
            .second;
    EXPECT_TRUE(fresh) << "key " << copy.keys[i] << " twice";
  }
}

// The kinds of table the cut tests run on: plain, with a TTL, with a capacity, and with
// admission, a TTL and a capacity.
const std::string kCutTableSpecs[] = {
    "", "eviction { ttl_steps: 5 }", "eviction { max_rows: 700 }",
    "admission { min_count: 2 } eviction { ttl_steps: 4 max_rows: 900 }"};

// Eight steps of pushes into `table` (then `extra_keys` more rows where it has room), and the
// rows it holds then, as CopyRows gives them; *step is the next step.
Rows FillForCut(EmbeddingTable& table, size_t stride, int64_t extra_keys, int* step) {
  for (*step = 0; *step < 8; ++*step) {
    table.ObserveStep(*step);
    Push(table, Range(*step * 60, *step * 60 + 400), 0.01f * *step);
  }
  if (extra_keys > 0) Push(table, Range(100000, 100000 + extra_keys), 0.5f);
  EmbeddingTable::RowsCopy at_mark;
  table.CopyRows(&at_mark);
  Rows rows;
  RowsOf(at_mark, stride, &rows);
  return rows;
}

// A marked cut (copy-on-write) gives, stripe by stripe, exactly what CopyRows gave at the mark,
// however the table changes meanwhile: updates of rows, new rows, rows evicted for capacity or
// their TTL (and their numbers reused), expired rows restarted, pulls that create rows, a
// restore over a row, a Clear; stripes taken between the changes. Only the rows changed in
// stripes not taken yet are kept aside.
TEST(EvictionTest, AMarkedCutGivesTheRowsOfTheMarkWhileTheTableChanges) {
  for (const std::string& spec : kCutTableSpecs) {
    SCOPED_TRACE(spec);
    for (const bool clear : {false, true}) {
      std::unique_ptr<EmbeddingTable> table = Table(spec, 3);
      ASSERT_NE(table, nullptr);
      const size_t stride = 3 * (1 + table->optimizer().num_slots());
      int step = 0;
      const Rows want = FillForCut(*table, stride, /*extra_keys=*/0, &step);
      ASSERT_GT(want.size(), 0u);
      table->MarkCut();
      EXPECT_EQ(table->cut_kept_rows(), 0);
      Rows got;
      EmbeddingTable::RowsCopy taken;
      int next_stripe = 0;
      const auto take = [&](int stripes) {
        for (; stripes > 0 && next_stripe < EmbeddingTable::kNumStripes; --stripes) {
          taken = EmbeddingTable::RowsCopy();
          table->TakeStripeCut(next_stripe++, &taken);
          RowsOf(taken, stride, &got);
        }
      };
      take(5);
      for (; step < 20; ++step) {
        table->ObserveStep(step);
        Push(*table, Range(step * 60 - 200, step * 60 + 300), 0.02f * step);  // old and new
        Pull(*table, Range(5000 + step * 10, 5010 + step * 10));              // may create rows
        if (step == 12) {
          EXPECT_GT(table->cut_kept_rows(), 0);
          const std::vector<float> row(stride, 7.0f);
          ASSERT_TRUE(table->InsertRow(100, row.data(), 3, step).ok());
          if (clear) table->Clear();
        }
        take(3);
      }
      take(EmbeddingTable::kNumStripes);
      EXPECT_EQ(table->cut_kept_rows(), 0);
      EXPECT_EQ(got, want) << (clear ? "cleared" : "");
      // Each stripe is taken once: taking again gives nothing.
      taken = EmbeddingTable::RowsCopy();
      table->TakeStripeCut(0, &taken);
      EXPECT_TRUE(taken.keys.empty());
    }
  }
}

// The same while the stripes are taken on another thread a row at a time (TakeStripeCut lets go
// of the stripe's lock after each row), or in one piece that makes way whenever a push or a pull
// waits for the stripe (checked after each row): rows changed while the lock was let go come
// from what was kept aside, rows changed after their chunk was copied are kept nowhere, and the
// cut is still exactly the mark's rows, each once.
TEST(EvictionTest, AStripeTakenInChunksWhileTheTableChangesGivesTheRowsOfTheMark) {
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  for (const std::string& spec : kCutTableSpecs) {
    for (const std::pair<int64_t, int64_t>& rows :
         {std::pair<int64_t, int64_t>{1, kNever}, std::pair<int64_t, int64_t>{kNever, 1}}) {
      // Copies: a lambda cannot capture a structured binding in C++17.
      const int64_t chunk_rows = rows.first;
      const int64_t yield_rows = rows.second;
      SCOPED_TRACE(
          absl::StrCat(spec, ", chunks of ", chunk_rows, ", making way every ", yield_rows));
      for (const bool clear : {false, true}) {
        std::unique_ptr<EmbeddingTable> table = Table(spec, 3);
        ASSERT_NE(table, nullptr);
        const size_t stride = 3 * (1 + table->optimizer().num_slots());
        int step = 0;
        // Enough rows (where the table has room) that a stripe takes many chunks.
        const Rows want = FillForCut(*table, stride, /*extra_keys=*/20000, &step);
        ASSERT_GT(want.size(), 0u);
        table->MarkCut();
        Rows got;
        std::atomic<bool> changing{false};
        std::atomic<bool> taking{true};
        std::thread taker([&] {
          while (!changing) std::this_thread::yield();
          EmbeddingTable::RowsCopy taken;
          for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) {
            table->TakeStripeCut(s, &taken, /*removed=*/nullptr, chunk_rows, yield_rows);
          }
          RowsOf(taken, stride, &got);
          taking = false;
        });
        int changes = 0;
        for (; taking || changes < 3; ++step, ++changes) {
          table->ObserveStep(step);
          Push(*table, Range(step * 60 - 200, step * 60 + 300), 0.02f * step);  // old and new
          Pull(*table, Range(5000 + step * 10, 5010 + step * 10));              // may create rows
          if (clear && changes == 2) table->Clear();
          changing = true;
        }
        taker.join();
        EXPECT_EQ(table->cut_kept_rows(), 0);
        EXPECT_EQ(got, want) << (clear ? "cleared" : "") << " after " << changes << " changes";
      }
    }
  }
}

// Incremental cuts: after a mark that tracks changes, the next mark (a delta) gives only the rows
// changed between the two, as they were at the second, and the keys removed between them or
// past their TTL at the second; the rows of the first cut with the removed keys taken out and
// the delta put over are exactly what CopyRows gave at the second mark, however the table
// changes while the stripes are taken, and so on for a second delta after it.
TEST(EvictionTest, ADeltaCutGivesWhatChangedBetweenTwoMarks) {
  for (const std::string& spec : kCutTableSpecs) {
    SCOPED_TRACE(spec);
    std::unique_ptr<EmbeddingTable> table = Table(spec, 3);
    ASSERT_NE(table, nullptr);
    const size_t stride = 3 * (1 + table->optimizer().num_slots());
    EXPECT_FALSE(table->ChangesTracked()) << "before any mark";
    int step = 0;
    // Steps [first, last): pushes of old and new keys, pulls that may create rows, a restore
    // over a row; the stripes of the mark under way taken three at a time meanwhile.
    const auto train = [&](int last, const std::function<void()>& take) {
      for (; step < last; ++step) {
        table->ObserveStep(step);
        Push(*table, Range(step * 60 - 200, step * 60 + 300), 0.02f * step);
        Pull(*table, Range(5000 + step * 10, 5010 + step * 10));
        if (step % 7 == 3) {
          const std::vector<float> row(stride, 7.0f + step);
          ASSERT_TRUE(table->InsertRow(100 + step, row.data(), 3, step).ok());
        }
        take();
      }
    };
    const auto none = [] {};
    train(8, none);
    // The full cut, which starts the tracking.
    EmbeddingTable::RowsCopy copy;
    table->CopyRows(&copy);
    Rows model;
    RowsOf(copy, stride, &model);
    table->MarkCut(/*delta=*/false, /*track_changes=*/true);
    Rows full;
    for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) {
      EmbeddingTable::RowsCopy taken;
      table->TakeStripeCut(s, &taken);
      RowsOf(taken, stride, &full);
    }
    ASSERT_EQ(full, model);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(absl::StrCat("delta ", round + 1));
      train(step + 8, none);
      EXPECT_TRUE(table->ChangesTracked());
      // The clock moves on with no push: rows past their TTL at the mark, not swept yet.
      table->ObserveStep(step + 2);
      EmbeddingTable::RowsCopy at_mark;
      table->CopyRows(&at_mark);
      Rows want;
      RowsOf(at_mark, stride, &want);
      table->MarkCut(/*delta=*/true, /*track_changes=*/true);
      Rows delta;
      std::vector<int64_t> removed;
      int next_stripe = 0;
      const auto take = [&](int stripes) {
        for (; stripes > 0 && next_stripe < EmbeddingTable::kNumStripes; --stripes) {
          EmbeddingTable::RowsCopy taken;
          table->TakeStripeCut(next_stripe++, &taken, &removed);
          RowsOf(taken, stride, &delta);
        }
      };
      take(4);  // before any change: their expired rows are still there
      train(step + 10, [&] { take(3); });
      take(EmbeddingTable::kNumStripes);
      // The chain so far, with this delta: removed keys out, changed rows over.
      for (const int64_t key : removed) model.erase(key);
      for (const auto& [key, row] : delta) model[key] = row;
      EXPECT_EQ(model, want);
      // Only what changed: the keys pushed before the first mark and never since are not in it.
      EXPECT_LT(delta.size(), want.size() + removed.size());
      if (spec.empty()) {
        EXPECT_TRUE(removed.empty());
        EXPECT_FALSE(delta.count(0)) << "key 0 was pushed before the first mark only";
      } else {
        EXPECT_FALSE(removed.empty()) << "rows went for their TTL or the capacity";
      }
    }
    // A clear loses track of what changed: the next cut must be full.
    table->Clear();
    EXPECT_FALSE(table->ChangesTracked());
    // A mark that does not track changes leaves none tracked either.
    table->MarkCut(/*delta=*/false, /*track_changes=*/false);
    table->DropCut();
    EXPECT_FALSE(table->ChangesTracked());
  }
}

// A delta holds the rows pushed since the last mark and no others, whichever path applies the
// pushes (a plain table's, or the one of tables with admission or eviction).
TEST(EvictionTest, ADeltaHoldsOnlyTheRowsPushedSinceTheLastMark) {
  for (const std::string spec : {"", "eviction { max_rows: 100000 }",
                                 "admission { min_count: 1 } eviction { ttl_steps: 1000 }"}) {
    SCOPED_TRACE(spec);
    std::unique_ptr<EmbeddingTable> table = Table(spec, 2);
    ASSERT_NE(table, nullptr);
    Push(*table, Range(0, 5000));
    table->MarkCut(/*delta=*/false, /*track_changes=*/true);
    table->DropCut();
    Push(*table, Range(4000, 6000));  // 1,000 old rows, 1,000 new
    table->MarkCut(/*delta=*/true, /*track_changes=*/true);
    std::vector<int64_t> keys, removed;
    for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) {
      EmbeddingTable::RowsCopy taken;
      table->TakeStripeCut(s, &taken, &removed);
      keys.insert(keys.end(), taken.keys.begin(), taken.keys.end());
    }
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(keys, Range(4000, 6000));
    EXPECT_TRUE(removed.empty());
  }
}

// DropCut lets a mark go: no stripe keeps rows for it any more, and the table goes on as usual.
TEST(EvictionTest, ADroppedCutKeepsNothing) {
  std::unique_ptr<EmbeddingTable> table = Table("eviction { max_rows: 500 }", 2);
  ASSERT_NE(table, nullptr);
  Push(*table, Range(0, 400));
  table->MarkCut();
  Push(*table, Range(200, 600));
  EXPECT_GT(table->cut_kept_rows(), 0);
  table->DropCut();
  EXPECT_EQ(table->cut_kept_rows(), 0);
  Push(*table, Range(0, 100));
  EXPECT_EQ(table->cut_kept_rows(), 0);
  EmbeddingTable::RowsCopy taken;
  table->TakeStripeCut(3, &taken);
  EXPECT_TRUE(taken.keys.empty());
}

TEST(AdmissionAndEvictionTest, BadSpecsAreRefusedNamingTheField) {
  const struct {
    std::string extra, message;
  } cases[] = {
      {"admission { min_count: 70000 }",
       "admission.min_count 70000: expected a count in [0, 65535]"},
      {"admission { probability: 1.5 }", "admission.probability 1.5: expected a probability"},
      {"admission { sketch_width: -1 }", "admission.sketch_width -1"},
      {"eviction { ttl_steps: -2 }", "eviction.ttl_steps -2"},
      {"eviction { ttl_steps: 5 ttl_seconds: 5 }", "0 when ttl_steps is set"},
      {"eviction { max_rows: -1 }", "eviction.max_rows -1"},
      {"eviction { max_bytes: 100 }", "expected room for at least 64"},
  };
  for (const auto& c : cases) {
    const v1::TableSpec spec = ParseTable(
        absl::StrCat("name: \"emb\" dim: 4 optimizer { sgd { learning_rate: 1 } } ", c.extra));
    absl::StatusOr<std::unique_ptr<EmbeddingTable>> table = EmbeddingTable::Create(spec, {0}, 1);
    ASSERT_FALSE(table.ok()) << c.extra;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr("table emb: ")) << c.extra;
    EXPECT_THAT(table.status().message(), HasSubstr(c.message)) << c.extra;
  }
}

}  // namespace
}  // namespace pscluster
