#include "testing/model_snapshot.h"

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/checkpoint.h"

namespace pscluster {

absl::StatusOr<ModelSnapshot> ReadModelSnapshot(const std::string& checkpoint) {
  // An incremental checkpoint's tables are read through the chain it builds on.
  PS_ASSIGN_OR_RETURN(const std::vector<ChainLink> chain, ReadChain(checkpoint));
  const v1::CheckpointManifest& manifest = chain.back().manifest;
  ModelSnapshot m;
  m.step = manifest.step();
  CheckpointReaders readers;
  std::map<std::string, std::vector<TableLink>> tables;
  for (const ChainLink& link : chain) {
    for (const v1::SavedShard& saved : link.manifest.shards()) {
      if (!saved.is_table()) continue;
      std::vector<TableLink>& links = tables[saved.name()];
      if (links.empty() || links.back().checkpoint_path != link.path) {
        links.push_back(TableLink{link.path, {}});
      }
      links.back().parts.push_back(&saved);
    }
  }
  for (const v1::SavedShard& saved : manifest.shards()) {
    if (saved.is_table()) continue;
    PS_ASSIGN_OR_RETURN(CheckpointReader * reader, readers.For(checkpoint, saved));
    PS_ASSIGN_OR_RETURN(DenseRecord r, reader->ReadDense(saved));
    const std::string name = absl::StrCat(saved.name(), "/", saved.partition());
    m.dense[name] = std::move(r.values_and_slots);
    m.dense_updates[name] = r.updates;
  }
  for (const auto& [name, links] : tables) {
    PS_ASSIGN_OR_RETURN(const CheckpointReader::TableRows rows,
                        ReadTableChain(links, -1, nullptr, &readers));
    const size_t stride = static_cast<size_t>(rows.stride);
    for (size_t i = 0; i < rows.keys.size(); ++i) {
      const float* row = rows.values.data() + i * stride;
      m.rows[{name, rows.keys[i]}] = std::vector<float>(row, row + stride);
      m.row_updates[{name, rows.keys[i]}] = rows.counts[i];
    }
  }
  return m;
}

namespace {

std::string Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return absl::StrFormat("%.9g (0x%08x)", f, u);
}

// Counts the floats of `a` and `b` that differ bit for bit (a length mismatch counts as one
// difference) and describes the first into *first.
int64_t Differences(const std::vector<float>& a, const std::vector<float>& b, std::string* first) {
  if (a.size() != b.size()) {
    *first = absl::StrCat(a.size(), " floats, expected ", b.size());
    return 1;
  }
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    if (n++ == 0) *first = absl::StrCat("[", i, "] = ", Bits(a[i]), ", expected ", Bits(b[i]));
  }
  return n;
}

}  // namespace

absl::Status CompareModels(const ModelSnapshot& expected, const ModelSnapshot& actual) {
  constexpr size_t kNamed = 5;  // differences named in the message
  std::vector<std::string> named;
  int64_t differing = 0;
  auto note = [&](std::string what) {
    ++differing;
    if (named.size() < kNamed) named.push_back(std::move(what));
  };
  if (actual.step != expected.step) {
    note(absl::StrCat("the step is ", actual.step, ", expected ", expected.step));
  }
  for (const auto& [name, values] : expected.dense) {
    auto it = actual.dense.find(name);
    if (it == actual.dense.end()) {
      note(absl::StrCat("dense ", name, " is missing"));
      continue;
    }
    std::string first;
    if (int64_t n = Differences(it->second, values, &first); n > 0) {
      note(absl::StrCat("dense ", name, ": ", n, " values differ, first ", first));
    }
    if (actual.dense_updates.at(name) != expected.dense_updates.at(name)) {
      note(absl::StrCat("dense ", name, " has ", actual.dense_updates.at(name),
                        " updates, expected ", expected.dense_updates.at(name)));
    }
  }
  for (const auto& [name, values] : actual.dense) {
    if (expected.dense.count(name) == 0) note(absl::StrCat("dense ", name, " is unexpected"));
  }
  for (const auto& [key, row] : expected.rows) {
    const std::string name = absl::StrCat(std::get<0>(key), "[", std::get<1>(key), "]");
    auto it = actual.rows.find(key);
    if (it == actual.rows.end()) {
      note(absl::StrCat("row ", name, " is missing"));
      continue;
    }
    std::string first;
    if (Differences(it->second, row, &first) > 0) note(absl::StrCat("row ", name, ": ", first));
    if (actual.row_updates.at(key) != expected.row_updates.at(key)) {
      note(absl::StrCat("row ", name, " has ", actual.row_updates.at(key), " updates, expected ",
                        expected.row_updates.at(key)));
    }
  }
  for (const auto& [key, updates] : actual.row_updates) {
    if (expected.rows.count(key) == 0 && updates != 0) {
      note(absl::StrCat("row ", std::get<0>(key), "[", std::get<1>(key), "] was updated ", updates,
                        " times and is not in the expected model"));
    }
  }
  if (differing == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the models differ in ", differing, " places (", expected.dense.size(), " dense partitions, ",
      expected.rows.size(), " rows expected): ", absl::StrJoin(named, "; ")));
}

}  // namespace pscluster
