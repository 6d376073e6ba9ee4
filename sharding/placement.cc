#include "sharding/placement.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "sharding/partitioner.h"
#include "sharding/sparse_hash.h"

namespace pscluster {
namespace {

constexpr int64_t kFloat32Bytes = 4;

// FNV-1a, 64 bits. Fields are fed one by one in a fixed encoding, so the digest does not
// depend on protobuf's serialization order, the platform's endianness or the build.
class Fnv1a64Digest {
 public:
  void AddInt(int64_t value) {
    uint64_t bits = static_cast<uint64_t>(value);
    for (int i = 0; i < 8; ++i) {
      AddByte(static_cast<uint8_t>(bits & 0xff));
      bits >>= 8;
    }
  }

  // Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
  void AddString(absl::string_view value) {
    AddInt(static_cast<int64_t>(value.size()));
    for (char c : value) AddByte(static_cast<uint8_t>(c));
  }

  uint64_t digest() const { return state_; }

 private:
  void AddByte(uint8_t byte) {
    const char c = static_cast<char>(byte);
    state_ = ::pscluster::Fnv1a64(absl::string_view(&c, 1), state_);
  }

  uint64_t state_ = kFnv1a64Basis;
};

// Names are unique across variables and tables; `owners` maps each name seen so far to a
// description of its owner for the error message.
absl::Status CheckName(absl::string_view kind, int index, const std::string& name,
                       absl::flat_hash_map<std::string, std::string>& owners) {
  const std::string owner = absl::StrCat(kind, " #", index);
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, " has an empty name; every variable and table needs one"));
  }
  auto [it, inserted] = owners.emplace(name, owner);
  if (!inserted) {
    return absl::InvalidArgumentError(absl::StrCat("name '", name, "' is used by both ", it->second,
                                                   " and ", owner,
                                                   "; variable and table names must be unique"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(int32_t num_ps, const v1::PlacementOptions& options) {
  if (num_ps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_ps must be >= 1, got ", num_ps));
  }
  if (options.strategy() != v1::PlacementOptions::ROUND_ROBIN &&
      options.strategy() != v1::PlacementOptions::GREEDY_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.strategy ", options.strategy(),
                     " is not a known strategy (ROUND_ROBIN or GREEDY_BYTES)"));
  }
  if (options.max_partition_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.max_partition_bytes must be >= 0 (0 means never split), got ",
                     options.max_partition_bytes()));
  }
  if (options.num_virtual_shards() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.num_virtual_shards must be >= 0 (0 means ", kDefaultNumVirtualShards,
                     "), got ", options.num_virtual_shards()));
  }
  if (options.replication() < 0 || options.replication() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.replication must be 0 or 1 (no backup) or 2 (a primary and a backup), got ",
        options.replication()));
  }
  if (options.replication() == 2 && num_ps < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.replication 2 needs at least 2 ps tasks (a backup on another task), got ",
        num_ps));
  }
  return absl::OkStatus();
}

// With replication 2: the backup of every dense partition and virtual shard (BackupOf).
void AssignBackups(v1::Placement& placement) {
  const int32_t num_ps = placement.num_ps();
  std::vector<int64_t> partitions_of(num_ps, 0), shards_of(num_ps, 0);
  for (v1::DensePartition& partition : *placement.mutable_partitions()) {
    const int32_t primary = partition.ps_task();
    partition.set_backup_ps_task(BackupOf(primary, partitions_of[primary]++, num_ps));
  }
  for (int32_t primary : placement.virtual_shard_to_ps()) {
    placement.add_virtual_shard_to_backup_ps(BackupOf(primary, shards_of[primary]++, num_ps));
  }
}

// Appends the partitions of every variable to `placement`, with ps_task not yet set.
absl::Status AddDensePartitions(const v1::ModelSpec& model, int64_t max_partition_bytes,
                                int64_t split_bytes, int32_t num_ps, v1::Placement& placement) {
  for (const v1::VariableSpec& variable : model.variables()) {
    if (variable.dtype() != v1::DT_FLOAT32 && variable.dtype() != v1::DT_INVALID) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable '", variable.name(), "' has dtype ", v1::DataType_Name(variable.dtype()), " (",
          variable.dtype(), "); only DT_FLOAT32 variables can be placed"));
    }
    absl::StatusOr<std::vector<RowRange>> ranges =
        PartitionRows(variable.shape(), kFloat32Bytes, max_partition_bytes);
    if (!ranges.ok()) {
      return absl::Status(ranges.status().code(), absl::StrCat("variable '", variable.name(),
                                                               "': ", ranges.status().message()));
    }
    // Cannot fail: PartitionRows accepted the same shape.
    const int64_t row_bytes = BytesPerRow(variable.shape(), kFloat32Bytes).value();
    const int64_t rows = variable.shape().dims_size() == 0 ? 1 : variable.shape().dims(0);
    if (split_bytes > 0 && num_ps > 1 && rows >= 2 && row_bytes > 0 &&
        rows >= split_bytes / row_bytes + (split_bytes % row_bytes != 0) &&
        static_cast<int64_t>(ranges->size()) < num_ps) {
      // Large: one partition per ps task (fewer when it has fewer rows).
      const int64_t parts = std::min<int64_t>(num_ps, rows);
      const int64_t rows_per_part = (rows + parts - 1) / parts;
      ranges = PartitionRows(variable.shape(), kFloat32Bytes, rows_per_part * row_bytes);
      if (!ranges.ok()) return ranges.status();
    }
    const int32_t num_partitions = static_cast<int32_t>(ranges->size());
    for (int32_t p = 0; p < num_partitions; ++p) {
      const RowRange& range = (*ranges)[p];
      v1::DensePartition* partition = placement.add_partitions();
      partition->set_variable(variable.name());
      partition->set_partition(p);
      partition->set_num_partitions(num_partitions);
      partition->set_row_begin(range.begin);
      partition->set_row_end(range.end);
      partition->set_bytes((range.end - range.begin) * row_bytes);
    }
  }
  return absl::OkStatus();
}

void AssignRoundRobin(int32_t num_ps, v1::Placement& placement) {
  for (int k = 0; k < placement.partitions_size(); ++k) {
    placement.mutable_partitions(k)->set_ps_task(k % num_ps);
  }
}

void AssignGreedyBytes(int32_t num_ps, v1::Placement& placement) {
  // Ordered by (bytes, ps index), so begin() is the least-loaded ps, lowest index on ties.
  // Only the first min(num_ps, partitions) tasks can ever be chosen, since a task with no
  // partition yet has 0 bytes and the lowest such index wins.
  std::set<std::pair<int64_t, int32_t>> loads;
  const int64_t candidates = std::min<int64_t>(num_ps, placement.partitions_size());
  for (int32_t ps = 0; ps < candidates; ++ps) loads.emplace(0, ps);
  for (v1::DensePartition& partition : *placement.mutable_partitions()) {
    auto [bytes, ps] = *loads.begin();
    loads.erase(loads.begin());
    partition.set_ps_task(ps);
    loads.emplace(bytes + partition.bytes(), ps);
  }
}

std::string StrategyName(v1::PlacementOptions::Strategy strategy) {
  const std::string& name = v1::PlacementOptions::Strategy_Name(strategy);
  return name.empty() ? absl::StrCat("STRATEGY_", static_cast<int>(strategy)) : name;
}

// Formats `rows` as columns separated by two spaces, each as wide as its widest cell.
// Columns whose index is in `right_aligned` are right-aligned (numbers).
void AppendTable(const std::vector<std::vector<std::string>>& rows,
                 const std::set<size_t>& right_aligned, std::string& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      const int width = static_cast<int>(widths[c]);
      if (right_aligned.count(c) > 0) {
        absl::StrAppendFormat(&line, "%*s", width, row[c]);
      } else {
        absl::StrAppendFormat(&line, "%-*s", width, row[c]);
      }
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, "  ", line, "\n");
  }
}

}  // namespace

absl::StatusOr<v1::Placement> ComputePlacement(const v1::ModelSpec& model, int32_t num_ps,
                                               const v1::PlacementOptions& options) {
  PS_RETURN_IF_ERROR(ValidateOptions(num_ps, options));

  absl::flat_hash_map<std::string, std::string> owners;
  for (int i = 0; i < model.variables_size(); ++i) {
    PS_RETURN_IF_ERROR(CheckName("variable", i, model.variables(i).name(), owners));
  }
  for (int i = 0; i < model.tables_size(); ++i) {
    const v1::TableSpec& table = model.tables(i);
    PS_RETURN_IF_ERROR(CheckName("table", i, table.name(), owners));
    if (table.dim() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table.name(), "' has dim ",
                                                     table.dim(), "; a table's dim must be >= 1"));
    }
  }

  v1::Placement placement;
  placement.set_num_ps(num_ps);
  *placement.mutable_options() = options;
  const int32_t num_virtual_shards =
      options.num_virtual_shards() == 0 ? kDefaultNumVirtualShards : options.num_virtual_shards();
  placement.mutable_options()->set_num_virtual_shards(num_virtual_shards);

  const int64_t split_bytes =
      options.split_bytes() == 0 ? kDefaultSplitBytes : options.split_bytes();
  placement.mutable_options()->set_split_bytes(split_bytes);
  PS_RETURN_IF_ERROR(
      AddDensePartitions(model, options.max_partition_bytes(), split_bytes, num_ps, placement));
  if (options.strategy() == v1::PlacementOptions::GREEDY_BYTES) {
    AssignGreedyBytes(num_ps, placement);
  } else {
    AssignRoundRobin(num_ps, placement);
  }

  for (const v1::TableSpec& table : model.tables()) {
    v1::TablePlacement* table_placement = placement.add_tables();
    table_placement->set_table(table.name());
    table_placement->set_dim(table.dim());
    table_placement->set_vocabulary_size(table.vocabulary_size());
  }
  for (int32_t ps : AssignVirtualShards(num_virtual_shards, num_ps)) {
    placement.add_virtual_shard_to_ps(ps);
  }
  if (options.replication() == 2) AssignBackups(placement);
  placement.set_version(PlacementVersion(placement));
  return placement;
}

int64_t PlacementVersion(const v1::Placement& placement) {
  Fnv1a64Digest hash;
  // A format tag, so that a future change of the encoding below cannot collide by accident.
  hash.AddString("pscluster.v1.Placement/fnv1a64/2");
  hash.AddInt(placement.num_ps());
  hash.AddInt(placement.options().strategy());
  hash.AddInt(placement.options().max_partition_bytes());
  hash.AddInt(placement.options().num_virtual_shards());
  hash.AddInt(placement.options().split_bytes());
  hash.AddInt(placement.partitions_size());
  for (const v1::DensePartition& partition : placement.partitions()) {
    hash.AddString(partition.variable());
    hash.AddInt(partition.partition());
    hash.AddInt(partition.num_partitions());
    hash.AddInt(partition.row_begin());
    hash.AddInt(partition.row_end());
    hash.AddInt(partition.ps_task());
    hash.AddInt(partition.bytes());
  }
  hash.AddInt(placement.tables_size());
  for (const v1::TablePlacement& table : placement.tables()) {
    hash.AddString(table.table());
    hash.AddInt(table.dim());
    // Only when set, so that placements of hashed tables keep the versions they had before.
    if (table.vocabulary_size() > 0) hash.AddInt(table.vocabulary_size());
  }
  hash.AddInt(placement.virtual_shard_to_ps_size());
  for (int32_t ps : placement.virtual_shard_to_ps()) hash.AddInt(ps);
  // Only with backups, so that placements without them keep the versions they had before.
  if (placement.options().replication() >= 2) {
    hash.AddInt(placement.options().replication());
    for (const v1::DensePartition& partition : placement.partitions()) {
      hash.AddInt(partition.backup_ps_task());
    }
    hash.AddInt(placement.virtual_shard_to_backup_ps_size());
    for (int32_t ps : placement.virtual_shard_to_backup_ps()) hash.AddInt(ps);
  }

  const int64_t version = static_cast<int64_t>(hash.digest() & 0x7fffffffffffffffULL);
  // 0 is what an unset version reads as; keep it free to mean "no placement".
  return version == 0 ? 1 : version;
}

std::string PlacementDebugString(const v1::Placement& placement) {
  const bool backups = placement.options().replication() >= 2;
  std::string out = absl::StrFormat(
      "Placement version %d: %d ps tasks, strategy %s, max_partition_bytes %d, "
      "%d virtual shards%s\n",
      placement.version(), placement.num_ps(), StrategyName(placement.options().strategy()),
      placement.options().max_partition_bytes(), placement.virtual_shard_to_ps_size(),
      backups ? ", each with a backup" : "");

  // Per ps task: {dense partitions, dense bytes, virtual shards}.
  struct PsLoad {
    int64_t partitions = 0;
    int64_t bytes = 0;
    int64_t virtual_shards = 0;
    int64_t backup_bytes = 0;
    int64_t backup_shards = 0;
  };
  std::map<int32_t, PsLoad> loads;

  absl::StrAppend(&out, "Dense partitions (", placement.partitions_size(), "):\n");
  std::vector<std::vector<std::string>> rows = {
      {"variable", "partition", "rows", "ps task", "bytes"}};
  if (backups) rows[0].push_back("backup");
  for (const v1::DensePartition& partition : placement.partitions()) {
    rows.push_back({partition.variable(),
                    absl::StrCat(partition.partition(), "/", partition.num_partitions()),
                    absl::StrCat("[", partition.row_begin(), ", ", partition.row_end(), ")"),
                    absl::StrCat(partition.ps_task()), absl::StrCat(partition.bytes())});
    PsLoad& load = loads[partition.ps_task()];
    ++load.partitions;
    load.bytes += partition.bytes();
    if (backups) {
      rows.back().push_back(absl::StrCat(partition.backup_ps_task()));
      loads[partition.backup_ps_task()].backup_bytes += partition.bytes();
    }
  }
  AppendTable(rows, backups ? std::set<size_t>{3, 4, 5} : std::set<size_t>{3, 4}, out);

  absl::StrAppend(&out, "Tables (", placement.tables_size(), "):\n");
  rows = {{"table", "dim", "keys"}};
  for (const v1::TablePlacement& table : placement.tables()) {
    rows.push_back(
        {table.table(), absl::StrCat(table.dim()),
         table.vocabulary_size() > 0 ? absl::StrCat("ids < ", table.vocabulary_size()) : "hashed"});
  }
  AppendTable(rows, {1}, out);

  for (int32_t ps : placement.virtual_shard_to_ps()) ++loads[ps].virtual_shards;
  for (int32_t ps : placement.virtual_shard_to_backup_ps()) ++loads[ps].backup_shards;
  absl::StrAppend(&out, "Per ps task:\n");
  rows = {{"ps task", "partitions", "dense bytes", "virtual shards"}};
  if (backups) {
    rows[0].push_back("backup bytes");
    rows[0].push_back("backup shards");
  }
  int64_t listed_in_range = 0;
  for (const auto& [ps, load] : loads) {
    rows.push_back({absl::StrCat(ps), absl::StrCat(load.partitions), absl::StrCat(load.bytes),
                    absl::StrCat(load.virtual_shards)});
    if (backups) {
      rows.back().push_back(absl::StrCat(load.backup_bytes));
      rows.back().push_back(absl::StrCat(load.backup_shards));
    }
    if (ps >= 0 && ps < placement.num_ps()) ++listed_in_range;
  }
  AppendTable(rows, backups ? std::set<size_t>{0, 1, 2, 3, 4, 5} : std::set<size_t>{0, 1, 2, 3},
              out);
  // Listing every idle task could take millions of lines; a count says the same.
  const int64_t idle = std::max<int64_t>(0, placement.num_ps() - listed_in_range);
  if (idle > 0) absl::StrAppend(&out, "  (", idle, " other ps tasks hold nothing)\n");
  return out;
}

absl::StatusOr<std::vector<const v1::DensePartition*>> PartitionsOf(const v1::Placement& placement,
                                                                    absl::string_view variable) {
  std::vector<const v1::DensePartition*> partitions;
  for (const v1::DensePartition& partition : placement.partitions()) {
    if (partition.variable() == variable) partitions.push_back(&partition);
  }
  if (partitions.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "variable '", variable, "' has no partition in placement version ", placement.version()));
  }
  std::stable_sort(partitions.begin(), partitions.end(),
                   [](const v1::DensePartition* a, const v1::DensePartition* b) {
                     return a->partition() < b->partition();
                   });
  return partitions;
}

std::vector<std::vector<int32_t>> VirtualShardsByPs(const v1::Placement& placement) {
  std::vector<std::vector<int32_t>> owned(std::max(0, placement.num_ps()));
  for (int32_t v = 0; v < placement.virtual_shard_to_ps_size(); ++v) {
    const int32_t ps = placement.virtual_shard_to_ps(v);
    if (ps >= 0 && ps < placement.num_ps()) owned[ps].push_back(v);
  }
  return owned;
}

}  // namespace pscluster
