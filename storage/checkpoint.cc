#include "storage/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"
#include "sharding/partitioner.h"
#include "storage/rocksdb_status.h"

namespace pscluster {
namespace {

constexpr char kManifest[] = "MANIFEST.json";
constexpr char kRecoveryIntent[] = "RECOVERY.json";
constexpr char kChiefEpoch[] = "CHIEF_EPOCH";
constexpr char kCheckpointPrefix[] = "ckpt-";

std::string DenseKey(const std::string& name, int32_t partition) {
  return absl::StrCat("d/", name, "/", partition);
}

std::string TablePrefix(const std::string& name) { return absl::StrCat("t/", name, "/"); }

std::string SketchKey(const std::string& table) { return absl::StrCat("s/", table); }

// A run's removed-keys record: "r/<table>/<run, 2 bytes big-endian>".
std::string RemovedPrefix(const std::string& table) { return absl::StrCat("r/", table, "/"); }
std::string RemovedKey(const std::string& table, int run) {
  std::string key = RemovedPrefix(table);
  key.push_back(static_cast<char>(run >> 8));
  key.push_back(static_cast<char>(run & 0xff));
  return key;
}

// `keys` sorted, once each, as a removed-keys record's value (int64, little-endian).
std::string RemovedValue(std::vector<int64_t>* keys) {
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
  std::string value(keys->size() * sizeof(int64_t), '\0');
  if (!keys->empty()) std::memcpy(value.data(), keys->data(), value.size());
  return value;
}

// Big-endian with the sign bit flipped: byte order equals numeric order.
std::string EncodeKey(int64_t key) {
  uint64_t u = static_cast<uint64_t>(key) ^ (uint64_t{1} << 63);
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(u & 0xff);
    u >>= 8;
  }
  return out;
}

int64_t DecodeKey(absl::string_view bytes) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(bytes[i]);
  return static_cast<int64_t>(u ^ (uint64_t{1} << 63));
}

// DATA_LOSS naming the file and table unless a table part read whole has the manifest's
// checksum and row count.
absl::Status CheckPart(const std::string& path, const v1::SavedShard& saved, uint32_t crc,
                       int64_t rows) {
  if (crc == saved.checksum() && rows == saved.rows()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": table ", saved.name(),
                                          " fails its checksum (", rows, " rows read, ",
                                          saved.rows(), " saved)"));
}

uint32_t Crc(uint32_t crc, absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

std::string Record(int64_t count, const float* values, int64_t n) {
  std::string out(sizeof(int64_t) + n * sizeof(float), '\0');
  std::memcpy(out.data(), &count, sizeof(count));
  // An empty shard's `values` may be null, which memcpy must not be given even for 0 bytes.
  if (n > 0) std::memcpy(out.data() + sizeof(count), values, n * sizeof(float));
  return out;
}

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  const int r = fsync(fd);
  close(fd);
  if (r != 0) return absl::UnavailableError(absl::StrCat("fsync ", path, ": ", strerror(errno)));
  return absl::OkStatus();
}

// The (step, sequence) of a checkpoint directory's name: "ckpt-0000000120" is (120, 0),
// "ckpt-0000000120.2" (120, 2). False for any other name.
bool ParseName(const std::string& name, std::pair<int64_t, int64_t>* order) {
  if (!absl::StartsWith(name, kCheckpointPrefix)) return false;
  const std::string rest = name.substr(strlen(kCheckpointPrefix));
  const size_t dot = rest.find('.');
  order->second = 0;
  if (dot != std::string::npos &&
      (!absl::SimpleAtoi(rest.substr(dot + 1), &order->second) || order->second < 1)) {
    return false;
  }
  return absl::SimpleAtoi(rest.substr(0, dot), &order->first) && order->first >= 0;
}

}  // namespace

std::string CheckpointDirName(int64_t step, int64_t sequence) {
  if (sequence > 0) return absl::StrFormat("%s%010d.%d", kCheckpointPrefix, step, sequence);
  return absl::StrFormat("%s%010d", kCheckpointPrefix, step);
}

namespace {

// INVALID_ARGUMENT when `path`, a ps task's part of a checkpoint, is a symbolic link: a part is
// a directory of the checkpoint's own, and a link (even one that leads nowhere yet) would take
// a write, or a read, somewhere else.
absl::Status CheckNotALink(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part ", path,
                     " is a symbolic link; a checkpoint's parts are directories of its own"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Open(
    const std::string& checkpoint_path, int ps_index, CrashPoints* crash_points) {
  std::error_code ec;
  std::filesystem::create_directories(checkpoint_path, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create checkpoint directory ", checkpoint_path, ": ", ec.message()));
  }
  const std::string file = absl::StrCat("ps-", ps_index);
  const std::string path = absl::StrCat(checkpoint_path, "/", file);
  PS_RETURN_IF_ERROR(CheckNotALink(path));
  rocksdb::Options options;
  // Written once, whole, then read once: no compaction while writing (its files are left in
  // level 0, in key order per table part), no compression (floats do not compress; it costs
  // CPU), and memtables of the default size, at most 3 of them (the writer's memory).
  options.PrepareForBulkLoad();
  options.max_write_buffer_number = 3;
  options.compression = rocksdb::kNoCompression;
  options.create_if_missing = true;
  options.error_if_exists = true;  // a checkpoint is written once
  rocksdb::DB* db = nullptr;
  PS_RETURN_IF_ERROR(FromRocksDb(rocksdb::DB::Open(options, path, &db), "creating " + path));
  MaybeCrash(crash_points, kCrashSaveOpened);
  return std::unique_ptr<CheckpointWriter>(
      new CheckpointWriter(file, path, options, std::unique_ptr<rocksdb::DB>(db), crash_points));
}

CheckpointWriter::CheckpointWriter(std::string file, std::string path,
                                   const rocksdb::Options& options, std::unique_ptr<rocksdb::DB> db,
                                   CrashPoints* crash_points)
    : file_(std::move(file)),
      path_(std::move(path)),
      options_(options),
      db_(std::move(db)),
      crash_points_(crash_points) {
  // No write-ahead log: Finish flushes the memtables into synced files, and a checkpoint that
  // crashed before it is never committed (its manifest comes last), so nothing is replayed.
  write_options_.disableWAL = true;
}

void CheckpointWriter::Written() {
  if (++shards_written_ == 1) MaybeCrash(crash_points_, kCrashSaveMidway);
}

CheckpointWriter::~CheckpointWriter() = default;

absl::StatusOr<v1::SavedShard> CheckpointWriter::WriteDense(
    const v1::DenseShardSpec& spec, int64_t updates, const std::vector<float>& values_and_slots) {
  const std::string key = DenseKey(spec.variable().name(), spec.partition().partition());
  const std::string value = Record(updates, values_and_slots.data(), values_and_slots.size());
  PS_RETURN_IF_ERROR(FromRocksDb(db_->Put(write_options_, key, value),
                                 absl::StrCat("writing ", key, " to ", file_)));
  v1::SavedShard saved;
  saved.set_name(spec.variable().name());
  saved.set_partition(spec.partition().partition());
  saved.set_file(file_);
  saved.set_checksum(Crc(Crc(0, key), value));
  saved.set_bytes(static_cast<int64_t>(value.size()));
  const RowRange rows = RowsOf(spec.partition());
  saved.set_rows(rows.end - rows.begin);
  *saved.mutable_dense() = spec;
  Written();
  return saved;
}

absl::StatusOr<v1::SavedShard> CheckpointWriter::WriteTable(const v1::TableSpec& spec,
                                                            std::vector<int64_t> keys,
                                                            absl::Span<const float> rows,
                                                            absl::Span<const int64_t> counts,
                                                            int64_t stride) {
  return WriteTableParts(
      spec, stride, /*runs=*/0,
      [&](int) -> absl::StatusOr<TableRun> {
        return TableRun{keys, counts, rows, {}};
      },
      /*delta=*/false, /*pool=*/nullptr);
}

absl::StatusOr<v1::SavedShard> CheckpointWriter::WriteTableRuns(
    const v1::TableSpec& spec, int64_t stride, int runs,
    const std::function<absl::StatusOr<TableRun>(int run)>& next, bool delta, ThreadPool* pool) {
  if (runs < 1 || runs > kMaxRuns) {
    return absl::InvalidArgumentError(absl::StrCat("table ", spec.name(), ": written in ", runs,
                                                   " runs, expected 1 to ", kMaxRuns));
  }
  return WriteTableParts(spec, stride, runs, next, delta, pool);
}

absl::Status CheckpointWriter::WriteRange(
    const v1::TableSpec& spec, int64_t stride, int runs, int begin, int end,
    const std::function<absl::StatusOr<TableRun>(int run)>& next, bool delta,
    const std::string& tag, const std::atomic<bool>& failed, RangeWritten* out) {
  const std::string prefix = TablePrefix(spec.name());
  const size_t key_at = prefix.size() + (runs > 0 ? 2 : 0);  // where a record's first key goes
  const std::string what = absl::StrCat("writing table ", spec.name(), " to ", file_);
  // The rows in key order straight into a table file of RocksDB's own format, which the
  // database then takes in whole (IngestExternalFile, the file moved in): no memtable, no
  // flush, no write-ahead log. Opened at the first row.
  const std::string sst = absl::StrCat(path_, ".table-", tag, ".sst");
  rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), options_);
  bool opened = false;
  std::string key = prefix + std::string(key_at - prefix.size(), '\0') + EncodeKey(0), value;
  std::vector<size_t> order;
  // A delta's removed keys, run by run into a second table file ("r/..." sorts before "t/...":
  // the two files do not overlap, and go in together).
  const std::string removed_sst = absl::StrCat(path_, ".removed-", tag, ".sst");
  rocksdb::SstFileWriter removed_writer(rocksdb::EnvOptions(), options_);
  bool removed_opened = false;
  std::vector<int64_t> removed;
  for (int r = begin; r < end; ++r) {
    if (failed.load(std::memory_order_relaxed)) {
      return absl::CancelledError("another range of the table failed");
    }
    PS_ASSIGN_OR_RETURN(const TableRun run, next(r));
    if (delta && !run.removed.empty()) {
      removed.assign(run.removed.begin(), run.removed.end());
      const std::string value = RemovedValue(&removed);
      const std::string key = RemovedKey(spec.name(), r);
      if (!removed_opened) {
        PS_RETURN_IF_ERROR(FromRocksDb(removed_writer.Open(removed_sst), what));
        removed_opened = true;
      }
      PS_RETURN_IF_ERROR(FromRocksDb(removed_writer.Put(key, value), what));
      out->removed_crc = Crc(Crc(out->removed_crc, key), value);
      out->removed_crc_bytes += key.size() + value.size();
      out->removed_total += static_cast<int64_t>(removed.size());
      out->bytes += static_cast<int64_t>(value.size());
    }
    order.resize(run.keys.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const absl::Span<const int64_t> keys = run.keys;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
    if (!order.empty() && !opened) {
      PS_RETURN_IF_ERROR(FromRocksDb(writer.Open(sst), what));
      opened = true;
    }
    if (runs > 0) {
      key[prefix.size()] = static_cast<char>(r >> 8);
      key[prefix.size() + 1] = static_cast<char>(r & 0xff);
    }
    // Blocks of kRowBlock rows in key order, each keyed by its first.
    for (size_t first = 0; first < order.size(); first += kRowBlock) {
      const int64_t n = static_cast<int64_t>(std::min<size_t>(kRowBlock, order.size() - first));
      value.resize(8 + 16 * n + 4 * n * stride);
      char* at = value.data();
      std::memcpy(at, &n, 8);
      for (int64_t j = 0; j < n; ++j) {
        const size_t i = order[first + j];
        std::memcpy(at + 8 + 8 * j, &keys[i], 8);
        std::memcpy(at + 8 + 8 * (n + j), &run.counts[i], 8);
        if (stride > 0) {
          std::memcpy(at + 8 + 16 * n + 4 * j * stride, run.rows.data() + i * stride, 4 * stride);
        }
      }
      key.replace(key_at, 8, EncodeKey(keys[order[first]]));
      out->crc = Crc(Crc(out->crc, key), value);
      out->crc_bytes += key.size() + value.size();
      out->bytes += static_cast<int64_t>(value.size());
      PS_RETURN_IF_ERROR(FromRocksDb(writer.Put(key, value), what));
    }
    out->total += static_cast<int64_t>(order.size());
  }
  if (removed_opened) {
    PS_RETURN_IF_ERROR(FromRocksDb(removed_writer.Finish(), what));
    out->removed_file = removed_sst;
  }
  if (opened) {
    PS_RETURN_IF_ERROR(FromRocksDb(writer.Finish(), what));
    out->table_file = sst;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SavedShard> CheckpointWriter::WriteTableParts(
    const v1::TableSpec& spec, int64_t stride, int runs,
    const std::function<absl::StatusOr<TableRun>(int run)>& next, bool delta, ThreadPool* pool) {
  // With a pool, the runs in ranges, one a thread (and the caller's), each range a table file
  // of its own: the ranges' keys do not overlap (the run is in every key), so the files go in
  // together, and the part's checksum is theirs combined in key order.
  const int parts = std::max(runs, 1);
  const int ranges = pool != nullptr && pool->num_threads() > 0 && runs > 1
                         ? static_cast<int>(std::min<int64_t>(runs, pool->num_threads() + 1))
                         : 1;
  std::vector<RangeWritten> written(ranges);
  std::atomic<bool> failed{false};
  const auto write = [&](int64_t g) {
    written[g].status = WriteRange(spec, stride, runs, static_cast<int>(parts * g / ranges),
                                   static_cast<int>(parts * (g + 1) / ranges), next, delta,
                                   absl::StrCat(shards_written_, "-", g), failed, &written[g]);
    if (!written[g].status.ok()) failed.store(true, std::memory_order_relaxed);
  };
  if (ranges == 1) {
    write(0);
  } else {
    pool->ForEachIndex(ranges, write);
  }
  for (const RangeWritten& w : written) {
    if (!w.status.ok() && !absl::IsCancelled(w.status)) return w.status;
  }
  std::vector<std::string> files;
  uLong crc = 0, removed_crc = 0;
  int64_t bytes = 0, total = 0, removed_total = 0;
  for (const RangeWritten& w : written) {
    if (!w.removed_file.empty()) files.push_back(w.removed_file);
    if (!w.table_file.empty()) files.push_back(w.table_file);
    crc = crc32_combine(crc, w.crc, static_cast<z_off_t>(w.crc_bytes));
    removed_crc =
        crc32_combine(removed_crc, w.removed_crc, static_cast<z_off_t>(w.removed_crc_bytes));
    bytes += w.bytes;
    total += w.total;
    removed_total += w.removed_total;
  }
  if (!files.empty()) {
    rocksdb::IngestExternalFileOptions ingest;
    ingest.move_files = true;
    PS_RETURN_IF_ERROR(FromRocksDb(db_->IngestExternalFile(files, ingest),
                                   absl::StrCat("writing table ", spec.name(), " to ", file_)));
  }
  v1::SavedShard saved;
  saved.set_name(spec.name());
  saved.set_partition(-1);
  saved.set_is_table(true);
  saved.set_file(file_);
  saved.set_checksum(static_cast<uint32_t>(crc));
  saved.set_bytes(bytes);
  saved.set_rows(total);
  saved.set_row_block(kRowBlock);
  saved.set_runs(runs);
  if (delta) {
    saved.set_delta(true);
    saved.set_removed_keys(removed_total);
    saved.set_removed_checksum(static_cast<uint32_t>(removed_crc));
  }
  *saved.mutable_table() = spec;
  Written();
  return saved;
}

absl::Status CheckpointWriter::WriteTableSketch(const std::vector<uint16_t>& counters,
                                                const std::vector<int32_t>& virtual_shards,
                                                v1::SavedShard* saved) {
  std::string value(counters.size() * sizeof(uint16_t), '\0');
  for (size_t i = 0; i < counters.size(); ++i) {
    value[2 * i] = static_cast<char>(counters[i] & 0xff);
    value[2 * i + 1] = static_cast<char>(counters[i] >> 8);
  }
  PS_RETURN_IF_ERROR(FromRocksDb(
      db_->Put(write_options_, SketchKey(saved->name()), value),
      absl::StrCat("writing the admission sketch of table ", saved->name(), " to ", file_)));
  saved->set_sketch_counters(static_cast<int64_t>(counters.size()));
  saved->set_sketch_checksum(Crc(0, value));
  saved->set_bytes(saved->bytes() + static_cast<int64_t>(value.size()));
  saved->mutable_virtual_shards()->Assign(virtual_shards.begin(), virtual_shards.end());
  return absl::OkStatus();
}

absl::Status CheckpointWriter::WriteTableRemoved(std::vector<int64_t> removed,
                                                 v1::SavedShard* saved) {
  const std::string value = RemovedValue(&removed);
  const std::string key = RemovedKey(saved->name(), 0);
  if (!removed.empty()) {
    PS_RETURN_IF_ERROR(FromRocksDb(
        db_->Put(write_options_, key, value),
        absl::StrCat("writing the removed keys of table ", saved->name(), " to ", file_)));
  }
  saved->set_delta(true);
  saved->set_removed_keys(static_cast<int64_t>(removed.size()));
  saved->set_removed_checksum(removed.empty() ? 0 : Crc(Crc(0, key), value));
  saved->set_bytes(saved->bytes() + static_cast<int64_t>(value.size()));
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Finish() {
  MaybeCrash(crash_points_, kCrashSaveBeforeSync);
  rocksdb::FlushOptions flush;
  flush.wait = true;
  PS_RETURN_IF_ERROR(FromRocksDb(db_->Flush(flush), "flushing " + file_));
  PS_RETURN_IF_ERROR(FromRocksDb(db_->Close(), "closing " + file_));
  MaybeCrash(crash_points_, kCrashSaveDone);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& db_path) {
  PS_RETURN_IF_ERROR(CheckNotALink(db_path));
  rocksdb::Options options;
  options.create_if_missing = false;
  options.paranoid_checks = true;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, db_path, &db);
  if (!s.ok()) {
    absl::Status st = FromRocksDb(s, "opening checkpoint shard file " + db_path);
    // A shard file that cannot be opened is lost data, whatever RocksDB calls it.
    return absl::DataLossError(st.message());
  }
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(db_path, std::unique_ptr<rocksdb::DB>(db)));
}

CheckpointReader::CheckpointReader(std::string path, std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), db_(std::move(db)) {}

CheckpointReader::~CheckpointReader() = default;

absl::StatusOr<DenseRecord> DecodeDenseRecord(const std::string& path, const v1::SavedShard& saved,
                                              absl::string_view key, absl::string_view value) {
  if (Crc(Crc(0, key), value) != saved.checksum() || value.size() < sizeof(int64_t) ||
      (value.size() - sizeof(int64_t)) % sizeof(float) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": ", saved.name(), "/",
                                            saved.partition(),
                                            " fails its checksum (the file is corrupt)"));
  }
  DenseRecord r;
  std::memcpy(&r.updates, value.data(), sizeof(int64_t));
  r.values_and_slots.resize((value.size() - sizeof(int64_t)) / sizeof(float));
  if (!r.values_and_slots.empty()) {
    std::memcpy(r.values_and_slots.data(), value.data() + sizeof(int64_t),
                r.values_and_slots.size() * sizeof(float));
  }
  return r;
}

TablePartDecoder::TablePartDecoder(std::string path, const v1::SavedShard& saved,
                                   int64_t reserve_rows)
    : path_(std::move(path)), saved_(saved), prefix_(Prefix(saved)) {
  const int64_t rows = std::clamp<int64_t>(saved.rows(), 0, std::max<int64_t>(reserve_rows, 0));
  keys_.reserve(rows);
  counts_.reserve(rows);
}

std::string TablePartDecoder::Prefix(const v1::SavedShard& saved) {
  return TablePrefix(saved.name());
}

absl::Status TablePartDecoder::Add(absl::string_view key, absl::string_view value) {
  crc_ = Crc(Crc(crc_, key), value);
  crc_bytes_ += key.size() + value.size();
  const size_t run_bytes = saved_.runs() > 0 ? 2 : 0;
  if (key.size() != prefix_.size() + run_bytes + 8) {
    return Malformed(absl::StrCat("its key has ", key.size(), " bytes, expected ",
                                  prefix_.size() + run_bytes + 8));
  }
  if (run_bytes == 0) return saved_.row_block() > 0 ? AddBlock(key, value) : AddRow(key, value);
  if (saved_.row_block() <= 0) return Malformed("runs of single rows (runs need blocks)");
  const int run = (static_cast<uint8_t>(key[prefix_.size()]) << 8) |
                  static_cast<uint8_t>(key[prefix_.size() + 1]);
  if (run >= saved_.runs() || run < run_) {
    return Malformed(absl::StrCat("it is in run ", run, ", expected ", std::max(run_, 0), " to ",
                                  saved_.runs() - 1));
  }
  if (run != run_) {
    run_ = run;
    have_last_ = false;  // keys increase within a run
  }
  // AddBlock reads the first key at prefix_.size(): two bytes fewer in front put it there.
  key.remove_prefix(run_bytes);
  return AddBlock(key, value);
}

absl::Status TablePartDecoder::Malformed(const std::string& what) const {
  return absl::DataLossError(
      absl::StrCat("checkpoint file ", path_, ": table ", saved_.name(), " has a malformed ",
                   saved_.row_block() > 0 ? "block of rows" : "row", ": ", what));
}

absl::Status TablePartDecoder::AddRow(absl::string_view key, absl::string_view value) {
  // An 8-byte update count, then whole float32s; every row as long as the first.
  if (value.size() < sizeof(int64_t) || (value.size() - sizeof(int64_t)) % sizeof(float) != 0 ||
      (stride_ >= 0 && static_cast<int64_t>(value.size()) != 8 + stride_ * 4)) {
    return Malformed(
        absl::StrCat(value.size(), " bytes, expected an 8-byte update count and ",
                     stride_ >= 0 ? absl::StrCat(stride_, " float32s (", 8 + stride_ * 4, " bytes)")
                                  : std::string("whole float32s")));
  }
  if (stride_ < 0) {
    stride_ = (static_cast<int64_t>(value.size()) - 8) / 4;
    values_.reserve(keys_.capacity() * stride_);
  }
  keys_.push_back(DecodeKey(key.substr(prefix_.size(), 8)));
  int64_t t;
  std::memcpy(&t, value.data(), 8);
  counts_.push_back(t);
  const size_t at = values_.size();
  values_.resize(at + stride_);
  if (stride_ > 0) std::memcpy(values_.data() + at, value.data() + 8, stride_ * 4);
  return absl::OkStatus();
}

absl::Status TablePartDecoder::AddBlock(absl::string_view key, absl::string_view value) {
  int64_t n = 0;
  if (value.size() >= 8) std::memcpy(&n, value.data(), 8);
  if (value.size() < 8 || n < 1 || n > saved_.row_block()) {
    return Malformed(absl::StrCat(value.size(), " bytes holding ", n, " rows, expected 1 to ",
                                  saved_.row_block()));
  }
  // After the count: n keys and n update counts, then n rows of whole float32s.
  const uint64_t heads = 8 + 16 * static_cast<uint64_t>(n);
  const uint64_t row_bytes = value.size() >= heads ? value.size() - heads : 0;
  if (value.size() < heads || row_bytes % (4 * static_cast<uint64_t>(n)) != 0 ||
      (stride_ >= 0 && row_bytes != 4 * static_cast<uint64_t>(n * stride_))) {
    return Malformed(absl::StrCat(
        value.size(), " bytes for ", n, " rows, expected ", heads, " of keys and counts and ",
        stride_ >= 0 ? absl::StrCat(n * stride_ * 4, " of rows of ", stride_, " float32s")
                     : std::string("whole float32 rows")));
  }
  const int64_t stride = static_cast<int64_t>(row_bytes / (4 * static_cast<uint64_t>(n)));
  const size_t first = keys_.size();
  keys_.resize(first + n);
  counts_.resize(first + n);
  std::memcpy(keys_.data() + first, value.data() + 8, 8 * n);
  std::memcpy(counts_.data() + first, value.data() + 8 + 8 * n, 8 * n);
  if (keys_[first] != DecodeKey(key.substr(prefix_.size(), 8))) {
    return Malformed(absl::StrCat("its first row's key ", keys_[first], " is not the record's, ",
                                  DecodeKey(key.substr(prefix_.size(), 8))));
  }
  // (In a part of runs, from the first key of the block's run.)
  for (size_t i = first; i < keys_.size(); ++i) {
    if (have_last_ && keys_[i] <= last_key_) {
      return Malformed(
          absl::StrCat("key ", keys_[i], " after ", last_key_, ": keys must increase"));
    }
    have_last_ = true;
    last_key_ = keys_[i];
  }
  if (stride_ < 0) {
    stride_ = stride;
    values_.reserve(keys_.capacity() * stride_);
  }
  const size_t at = values_.size();
  values_.resize(at + n * stride_);
  if (stride_ > 0) std::memcpy(values_.data() + at, value.data() + heads, row_bytes);
  return absl::OkStatus();
}

absl::Status TablePartDecoder::Take(std::vector<int64_t>* keys, std::vector<int64_t>* counts,
                                    UninitializedFloats* values) {
  PS_RETURN_IF_ERROR(Check());
  *keys = std::move(keys_);
  *counts = std::move(counts_);
  *values = std::move(values_);
  keys_.clear();
  counts_.clear();
  values_.clear();
  return absl::OkStatus();
}

absl::Status TablePartDecoder::TakeDecoded(std::vector<int64_t>* keys, std::vector<int64_t>* counts,
                                           UninitializedFloats* values) {
  if (rows_taken_ + static_cast<int64_t>(keys_.size()) > saved_.rows()) {
    return Check();  // more rows than the manifest's: the checksum cannot hold either
  }
  rows_taken_ += static_cast<int64_t>(keys_.size());
  keys->clear();
  counts->clear();
  values->clear();
  keys_.swap(*keys);
  counts_.swap(*counts);
  values_.swap(*values);
  return absl::OkStatus();
}

absl::Status TablePartDecoder::Check() const { return CheckPart(path_, saved_, crc_, rows()); }

absl::Status TablePartDecoder::Finish(
    const std::function<void(int64_t key, const float* row, int64_t t, int64_t stride)>& fn) {
  PS_RETURN_IF_ERROR(Check());
  const int64_t rows = static_cast<int64_t>(keys_.size());
  for (int64_t i = 0; i < rows; ++i)
    fn(keys_[i], values_.data() + i * stride_, counts_[i], stride_);
  return absl::OkStatus();
}

absl::StatusOr<DenseRecord> CheckpointReader::ReadDense(const v1::SavedShard& saved) {
  const std::string key = DenseKey(saved.name(), saved.partition());
  std::string value;
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  rocksdb::Status s = db_->Get(read, key, &value);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path_, ": cannot read ",
                                            saved.name(), "/", saved.partition(), ": ",
                                            s.ToString()));
  }
  return DecodeDenseRecord(path_, saved, key, value);
}

absl::StatusOr<std::vector<uint16_t>> CheckpointReader::ReadTableSketch(
    const v1::SavedShard& saved) {
  std::vector<uint16_t> counters;
  if (saved.sketch_counters() <= 0) return counters;
  std::string value;
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  const rocksdb::Status s = db_->Get(read, SketchKey(saved.name()), &value);
  const auto lost = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", path_, ": the admission sketch of table ", saved.name(), " ", what));
  };
  if (!s.ok()) return lost(absl::StrCat("cannot be read: ", s.ToString()));
  if (static_cast<int64_t>(value.size()) != saved.sketch_counters() * 2) {
    return lost(absl::StrCat("has ", value.size(), " bytes, the manifest says ",
                             saved.sketch_counters(), " 2-byte counters"));
  }
  if (Crc(0, value) != saved.sketch_checksum()) return lost("fails its checksum");
  counters.resize(static_cast<size_t>(saved.sketch_counters()));
  for (size_t i = 0; i < counters.size(); ++i) {
    counters[i] = static_cast<uint16_t>(static_cast<uint8_t>(value[2 * i]) |
                                        (static_cast<uint8_t>(value[2 * i + 1]) << 8));
  }
  return counters;
}

absl::StatusOr<std::vector<int64_t>> CheckpointReader::ReadTableRemoved(
    const v1::SavedShard& saved) {
  std::vector<int64_t> keys;
  if (!saved.delta()) return keys;
  const auto lost = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", path_, ": the removed keys of table ", saved.name(), " ", what));
  };
  if (saved.removed_keys() < 0) {
    return lost(absl::StrCat("number ", saved.removed_keys(), " in the manifest"));
  }
  keys.reserve(static_cast<size_t>(std::min<int64_t>(saved.removed_keys(), int64_t{1} << 24)));
  const std::string prefix = RemovedPrefix(saved.name());
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read));
  uint32_t crc = 0;
  int last_run = -1;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const absl::string_view key(it->key().data(), it->key().size());
    const absl::string_view value(it->value().data(), it->value().size());
    if (key.size() != prefix.size() + 2) return lost("have a record of another key's length");
    const int run = static_cast<uint8_t>(key[prefix.size()]) << 8 |
                    static_cast<uint8_t>(key[prefix.size() + 1]);
    if (run <= last_run) return lost(absl::StrCat("have run ", run, " after run ", last_run));
    last_run = run;
    if (value.size() % 8 != 0) {
      return lost(absl::StrCat("have a record of ", value.size(), " bytes, not whole keys"));
    }
    const size_t n = value.size() / 8;
    if (static_cast<int64_t>(keys.size() + n) > saved.removed_keys()) {
      return lost(
          absl::StrCat("are more than the ", saved.removed_keys(), " keys the manifest says"));
    }
    const size_t begin = keys.size();
    keys.resize(begin + n);
    if (n > 0) std::memcpy(keys.data() + begin, value.data(), value.size());
    for (size_t i = begin + 1; i < keys.size(); ++i) {
      if (keys[i] <= keys[i - 1]) {
        return lost(absl::StrCat("are not in increasing order in run ", run, " (", keys[i],
                                 " after ", keys[i - 1], ")"));
      }
    }
    crc = Crc(Crc(crc, key), value);
  }
  if (!it->status().ok()) return lost(absl::StrCat("cannot be read: ", it->status().ToString()));
  if (static_cast<int64_t>(keys.size()) != saved.removed_keys()) {
    return lost(
        absl::StrCat("are ", keys.size(), " keys, the manifest says ", saved.removed_keys()));
  }
  if (crc != saved.removed_checksum()) return lost("fail their checksum");
  return keys;
}

absl::Status CheckpointReader::ReadTable(
    const v1::SavedShard& saved,
    const std::function<void(int64_t key, const float* row, int64_t t)>& fn, int64_t stride) {
  return ReadTableRows(
      saved,
      [&fn](int64_t key, const float* row, int64_t t, int64_t /*stride*/) { fn(key, row, t); },
      stride);
}

TablePartDecoder CheckpointReader::DecoderFor(const v1::SavedShard& saved) {
  const std::string prefix = TablePartDecoder::Prefix(saved);
  // The part's bytes on disk bound its rows (16 bytes of key and count each, at least): room
  // for them all at once, whatever the manifest says.
  std::string limit = prefix;
  limit.back() = static_cast<char>(limit.back() + 1);
  const rocksdb::Range range(prefix, limit);
  uint64_t on_disk = 0;
  rocksdb::SizeApproximationOptions approximation;
  approximation.include_files = true;
  approximation.include_memtables = false;
  if (!db_->GetApproximateSizes(approximation, db_->DefaultColumnFamily(), &range, 1, &on_disk)
           .ok()) {
    on_disk = 0;
  }
  return TablePartDecoder(path_, saved, static_cast<int64_t>(on_disk / 16) + (int64_t{1} << 16));
}

absl::Status CheckpointReader::ForEachRecord(
    const v1::SavedShard& saved,
    const std::function<absl::Status(absl::string_view key, absl::string_view value)>& fn,
    const std::string& from, const std::string& to) {
  const std::string prefix = TablePartDecoder::Prefix(saved);
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  // One pass in key order over a part written once: large sequential reads, and its blocks
  // not kept in the cache.
  read.readahead_size = 8 << 20;
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read));
  const rocksdb::Slice end(to);
  for (it->Seek(from.empty() ? prefix : from);
       it->Valid() && it->key().starts_with(prefix) && (to.empty() || it->key().compare(end) < 0);
       it->Next()) {
    const rocksdb::Slice k = it->key(), v = it->value();
    PS_RETURN_IF_ERROR(
        fn(absl::string_view(k.data(), k.size()), absl::string_view(v.data(), v.size())));
  }
  if (!it->status().ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path_, ": reading table ",
                                            saved.name(), ": ", it->status().ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckStride(const v1::SavedShard& saved,
                                           const TablePartDecoder& decoder, int64_t stride) const {
  if (stride < 0 || decoder.stride() < 0 || decoder.stride() == stride) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint file ", path_, ": table ", saved.name(),
                                          " has rows of ", decoder.stride(),
                                          " floats (values and optimizer slots), expected ", stride,
                                          "; was it saved with another dim or optimizer?"));
}

absl::Status CheckpointReader::Decode(const v1::SavedShard& saved, int64_t stride,
                                      TablePartDecoder* decoder) {
  PS_RETURN_IF_ERROR(
      ForEachRecord(saved, [decoder](absl::string_view key, absl::string_view value) {
        return decoder->Add(key, value);
      }));
  return CheckStride(saved, *decoder, stride);
}

absl::Status CheckpointReader::ReadTableRows(
    const v1::SavedShard& saved,
    const std::function<void(int64_t key, const float* row, int64_t t, int64_t stride)>& fn,
    int64_t stride) {
  TablePartDecoder decoder = DecoderFor(saved);
  PS_RETURN_IF_ERROR(Decode(saved, stride, &decoder));
  return decoder.Finish(fn);
}

absl::StatusOr<CheckpointReader::TableRows> CheckpointReader::ReadTableWhole(
    const v1::SavedShard& saved, int64_t stride) {
  TablePartDecoder decoder = DecoderFor(saved);
  PS_RETURN_IF_ERROR(Decode(saved, stride, &decoder));
  TableRows rows;
  rows.stride = std::max<int64_t>(decoder.stride(), 0);
  PS_RETURN_IF_ERROR(decoder.Take(&rows.keys, &rows.counts, &rows.values));
  return rows;
}

absl::Status CheckpointReader::ReadTableBatches(
    const v1::SavedShard& saved, int64_t stride, int64_t batch_rows,
    const std::function<absl::Status(TableRows& batch)>& fn, ThreadPool* pool) {
  batch_rows = std::max<int64_t>(batch_rows, 1);
  if (pool != nullptr && pool->num_threads() > 0 && saved.runs() > 1 && stride >= 0) {
    return ReadTableBatchesInRanges(saved, stride, batch_rows, fn, pool);
  }
  TablePartDecoder decoder(path_, saved, batch_rows + kRowBlock);
  TableRows batch;
  PS_RETURN_IF_ERROR(ForEachRecord(saved, [&](absl::string_view key, absl::string_view value) {
    PS_RETURN_IF_ERROR(decoder.Add(key, value));
    if (decoder.size() < batch_rows) return absl::OkStatus();
    // Rows go out only once their length is known to be `stride`.
    PS_RETURN_IF_ERROR(CheckStride(saved, decoder, stride));
    batch.stride = decoder.stride();
    PS_RETURN_IF_ERROR(decoder.TakeDecoded(&batch.keys, &batch.counts, &batch.values));
    return fn(batch);
  }));
  // The last rows go out only once the whole part checked out.
  PS_RETURN_IF_ERROR(CheckStride(saved, decoder, stride));
  batch.stride = std::max<int64_t>(decoder.stride(), 0);
  PS_RETURN_IF_ERROR(decoder.Take(&batch.keys, &batch.counts, &batch.values));
  return batch.keys.empty() ? absl::OkStatus() : fn(batch);
}

absl::Status CheckpointReader::ReadTableBatchesInRanges(
    const v1::SavedShard& saved, int64_t stride, int64_t batch_rows,
    const std::function<absl::Status(TableRows& batch)>& fn, ThreadPool* pool) {
  const int runs = saved.runs();
  const int ranges = static_cast<int>(std::min<int64_t>(runs, pool->num_threads() + 1));
  const std::string prefix = TablePartDecoder::Prefix(saved);
  const auto run_key = [&prefix](int run) {
    return prefix + static_cast<char>(run >> 8) + static_cast<char>(run & 0xff);
  };
  struct Range {
    absl::Status status;
    uint32_t crc = 0;
    uint64_t crc_bytes = 0;
    int64_t rows = 0;
  };
  std::vector<Range> read(ranges);
  std::atomic<bool> failed{false};
  pool->ForEachIndex(ranges, [&](int64_t g) {
    // Runs [runs * g / ranges, runs * (g + 1) / ranges); the first range also gets whatever
    // sorts before run 0 and the last whatever after the last run, for the decoder to refuse.
    const int begin = static_cast<int>(runs * g / ranges);
    const int end = static_cast<int>(runs * (g + 1) / ranges);
    TablePartDecoder decoder(path_, saved, batch_rows + kRowBlock);
    TableRows batch;
    const auto hand_out = [&]() -> absl::Status {
      PS_RETURN_IF_ERROR(CheckStride(saved, decoder, stride));
      batch.stride = stride;
      PS_RETURN_IF_ERROR(decoder.TakeDecoded(&batch.keys, &batch.counts, &batch.values));
      return batch.keys.empty() ? absl::OkStatus() : fn(batch);
    };
    Range& r = read[g];
    r.status = ForEachRecord(
        saved,
        [&](absl::string_view key, absl::string_view value) {
          if (failed.load(std::memory_order_relaxed)) {
            return absl::CancelledError("another range of the part failed");
          }
          PS_RETURN_IF_ERROR(decoder.Add(key, value));
          return decoder.size() >= batch_rows ? hand_out() : absl::OkStatus();
        },
        g == 0 ? "" : run_key(begin), g + 1 == ranges ? "" : run_key(end));
    if (r.status.ok()) r.status = hand_out();
    if (!r.status.ok()) failed.store(true, std::memory_order_relaxed);
    r.crc = decoder.crc();
    r.crc_bytes = decoder.crc_bytes();
    r.rows = decoder.rows();
  });
  for (const Range& r : read) {
    if (!r.status.ok() && !absl::IsCancelled(r.status)) return r.status;
  }
  // The ranges in key order make the part: its CRC is theirs combined.
  uLong crc = read[0].crc;
  int64_t rows = read[0].rows;
  for (int g = 1; g < ranges; ++g) {
    crc = crc32_combine(crc, read[g].crc, static_cast<z_off_t>(read[g].crc_bytes));
    rows += read[g].rows;
  }
  return CheckPart(path_, saved, static_cast<uint32_t>(crc), rows);
}

absl::StatusOr<CheckpointReader*> CheckpointReaders::For(const std::string& checkpoint_path,
                                                         const v1::SavedShard& saved) {
  const std::string path = absl::StrCat(checkpoint_path, "/", saved.file());
  std::unique_ptr<CheckpointReader>& r = readers_[path];
  if (r == nullptr) {
    PS_ASSIGN_OR_RETURN(r, CheckpointReader::Open(path));
  }
  return r.get();
}

namespace {

// Appends the rows of `part` that `keep` accepts to *out (whose stride, if it has rows, must
// be part's).
absl::Status AppendKept(CheckpointReader::TableRows part, const std::function<bool(int64_t)>& keep,
                        CheckpointReader::TableRows* out) {
  if (part.keys.empty()) return absl::OkStatus();
  const size_t stride = static_cast<size_t>(part.stride);
  if (out->keys.empty() &&
      (keep == nullptr || std::all_of(part.keys.begin(), part.keys.end(), keep))) {
    *out = std::move(part);  // the whole part, its buffers taken
    return absl::OkStatus();
  }
  out->stride = part.stride;
  for (size_t i = 0; i < part.keys.size(); ++i) {
    if (keep != nullptr && !keep(part.keys[i])) continue;
    out->keys.push_back(part.keys[i]);
    out->counts.push_back(part.counts[i]);
    out->values.insert(out->values.end(), part.values.begin() + i * stride,
                       part.values.begin() + (i + 1) * stride);
  }
  return absl::OkStatus();
}

// The link of `links` the table's rows start from: the last one whose parts are all whole.
// DATA_LOSS when none is, or a link after it has a whole part among its deltas.
absl::StatusOr<size_t> ChainBase(const std::vector<TableLink>& links) {
  const auto whole = [](const TableLink& link) {
    return std::none_of(link.parts.begin(), link.parts.end(),
                        [](const v1::SavedShard* s) { return s->delta(); });
  };
  size_t base = links.size();
  while (base > 0 && !whole(links[base - 1])) --base;
  if (base == 0) {
    const std::string table =
        links.back().parts.empty() ? std::string() : links.back().parts.front()->name();
    return absl::DataLossError(absl::StrCat(
        "table ", table, ": no checkpoint of the chain ending at ", links.back().checkpoint_path,
        " holds it whole (the full checkpoint is missing)"));
  }
  --base;
  for (size_t l = base + 1; l < links.size(); ++l) {
    for (const v1::SavedShard* saved : links[l].parts) {
      if (!saved->delta()) {
        return absl::DataLossError(absl::StrCat(
            "table ", saved->name(), ": ", links[l].checkpoint_path, "/", saved->file(),
            " holds it whole, but other parts of that checkpoint are deltas"));
      }
    }
  }
  return base;
}

}  // namespace

absl::StatusOr<CheckpointReader::TableRows> ReadTableChain(
    const std::vector<TableLink>& links, int64_t stride,
    const std::function<bool(int64_t key)>& keep, CheckpointReaders* readers) {
  CheckpointReader::TableRows out;
  if (links.empty()) return out;
  PS_ASSIGN_OR_RETURN(const size_t base, ChainBase(links));
  for (const v1::SavedShard* saved : links[base].parts) {
    PS_ASSIGN_OR_RETURN(CheckpointReader * reader,
                        readers->For(links[base].checkpoint_path, *saved));
    PS_ASSIGN_OR_RETURN(CheckpointReader::TableRows part, reader->ReadTableWhole(*saved, stride));
    if (stride < 0 && !part.keys.empty()) stride = part.stride;
    PS_RETURN_IF_ERROR(AppendKept(std::move(part), keep, &out));
  }
  if (base + 1 == links.size()) return out;
  // The deltas in turn, by key: a removed key goes (marked, dropped at the end), a row is put
  // over the key's or added.
  absl::flat_hash_map<int64_t, size_t> at;
  at.reserve(out.keys.size());
  for (size_t i = 0; i < out.keys.size(); ++i) at.emplace(out.keys[i], i);
  std::vector<bool> gone(out.keys.size(), false);
  int64_t num_gone = 0;
  for (size_t l = base + 1; l < links.size(); ++l) {
    for (const v1::SavedShard* saved : links[l].parts) {
      PS_ASSIGN_OR_RETURN(CheckpointReader * reader,
                          readers->For(links[l].checkpoint_path, *saved));
      PS_ASSIGN_OR_RETURN(const std::vector<int64_t> removed, reader->ReadTableRemoved(*saved));
      for (const int64_t key : removed) {
        auto it = at.find(key);
        if (it == at.end()) continue;
        gone[it->second] = true;
        ++num_gone;
        at.erase(it);
      }
      PS_ASSIGN_OR_RETURN(CheckpointReader::TableRows part, reader->ReadTableWhole(*saved, stride));
      if (part.keys.empty()) continue;
      if (stride < 0) stride = part.stride;
      if (out.stride == 0) out.stride = part.stride;
      const size_t n = static_cast<size_t>(part.stride);
      for (size_t i = 0; i < part.keys.size(); ++i) {
        const int64_t key = part.keys[i];
        if (keep != nullptr && !keep(key)) continue;
        const float* row = part.values.data() + i * n;
        auto [it, added] = at.emplace(key, out.keys.size());
        if (added) {
          out.keys.push_back(key);
          out.counts.push_back(part.counts[i]);
          out.values.insert(out.values.end(), row, row + n);
          gone.push_back(false);
        } else {
          out.counts[it->second] = part.counts[i];
          std::copy(row, row + n, out.values.begin() + it->second * n);
        }
      }
    }
  }
  if (num_gone > 0) {
    const size_t n = static_cast<size_t>(out.stride);
    size_t kept = 0;
    for (size_t i = 0; i < out.keys.size(); ++i) {
      if (gone[i]) continue;
      if (kept != i) {
        out.keys[kept] = out.keys[i];
        out.counts[kept] = out.counts[i];
        std::copy(out.values.begin() + i * n, out.values.begin() + (i + 1) * n,
                  out.values.begin() + kept * n);
      }
      ++kept;
    }
    out.keys.resize(kept);
    out.counts.resize(kept);
    out.values.resize(kept * n);
  }
  return out;
}

absl::Status ReadTableChainBatches(const std::vector<TableLink>& links, int64_t stride,
                                   int64_t batch_rows, const TableChainSink& sink,
                                   CheckpointReaders* readers, ThreadPool* pool) {
  if (links.empty()) return absl::OkStatus();
  PS_ASSIGN_OR_RETURN(const size_t base, ChainBase(links));
  for (size_t l = base; l < links.size(); ++l) {
    for (const v1::SavedShard* saved : links[l].parts) {
      PS_ASSIGN_OR_RETURN(CheckpointReader * reader,
                          readers->For(links[l].checkpoint_path, *saved));
      if (l > base) {
        PS_ASSIGN_OR_RETURN(const std::vector<int64_t> removed, reader->ReadTableRemoved(*saved));
        if (!removed.empty()) PS_RETURN_IF_ERROR(sink.remove(removed));
      }
      PS_RETURN_IF_ERROR(reader->ReadTableBatches(*saved, stride, batch_rows, sink.put, pool));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChainLink>> ReadChain(const std::string& checkpoint_path) {
  PS_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadManifest(checkpoint_path));
  const std::string dir = std::filesystem::path(checkpoint_path).parent_path().string();
  std::vector<ChainLink> links;
  for (int i = 0; i < manifest.chain_size(); ++i) {
    const std::string& name = manifest.chain(i);
    std::pair<int64_t, int64_t> order;
    if (!ParseName(name, &order)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint_path, " builds on \"", name,
                                              "\", which is not a checkpoint's name"));
    }
    ChainLink link;
    link.path = absl::StrCat(dir, "/", name);
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(link.path);
    if (!m.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint_path, " builds on ", name,
                                              ", which cannot be read: ", m.status().message()));
    }
    link.manifest = *std::move(m);
    const bool builds_on_the_rest =
        link.manifest.chain_size() == i &&
        std::equal(link.manifest.chain().begin(), link.manifest.chain().end(),
                   manifest.chain().begin());
    if (!builds_on_the_rest) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", checkpoint_path, " builds on ", name, ", which builds on [",
                       absl::StrJoin(link.manifest.chain(), ", "), "], not on the ", i,
                       " checkpoints before it in the chain"));
    }
    links.push_back(std::move(link));
  }
  links.push_back(ChainLink{checkpoint_path, std::move(manifest)});
  return links;
}

namespace {

absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 const std::string& json, CrashPoints* crash_points,
                                 const char* before_rename, const char* before_dir_sync,
                                 const std::function<absl::Status()>& may_rename = nullptr);

// Writes `message` as JSON to <dir>/<name>: <name>.tmp written and fsynced, renamed, the
// directory fsynced (WriteFileAtomically). A crash leaves the old file or the new one whole.
absl::Status WriteJsonAtomically(const std::string& dir, const std::string& name,
                                 const google::protobuf::Message& message,
                                 CrashPoints* crash_points, const char* before_rename,
                                 const char* before_dir_sync,
                                 const std::function<absl::Status()>& may_rename = nullptr) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) {
    return absl::InternalError(absl::StrCat("cannot encode ", name));
  }
  return WriteFileAtomically(dir, name, json, crash_points, before_rename, before_dir_sync,
                             may_rename);
}

absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 const std::string& json, CrashPoints* crash_points,
                                 const char* before_rename, const char* before_dir_sync,
                                 const std::function<absl::Status()>& may_rename) {
  const std::string tmp = absl::StrCat(dir, "/", name, ".tmp");
  const std::string final_path = absl::StrCat(dir, "/", name);
  {
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      return absl::UnavailableError(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
    const bool ok =
        write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size()) && fsync(fd) == 0;
    close(fd);
    if (!ok)
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  }
  if (before_rename != nullptr) MaybeCrash(crash_points, before_rename);
  if (may_rename) {
    if (absl::Status s = may_rename(); !s.ok()) {
      unlink(tmp.c_str());
      return s;
    }
  }
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, ": ", strerror(errno)));
  }
  if (before_dir_sync != nullptr) MaybeCrash(crash_points, before_dir_sync);
  return SyncPath(dir, /*directory=*/true);
}

// Parses `json` into *message: DATA_LOSS naming `what` and `path` if it does not parse.
absl::Status ParseJson(absl::string_view json, const std::string& path, const std::string& what,
                       google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  if (!google::protobuf::util::JsonStringToMessage(
           google::protobuf::StringPiece(json.data(), json.size()), message, options)
           .ok()) {
    return absl::DataLossError(absl::StrCat(what, " ", path, " does not parse"));
  }
  return absl::OkStatus();
}

// Reads <path> as JSON into *message: NOT_FOUND if there is no such file (`what` names it),
// DATA_LOSS if it does not parse.
absl::Status ReadJson(const std::string& path, const std::string& what,
                      google::protobuf::Message* message) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no ", what, " at ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseJson(ss.str(), path, what, message);
}

}  // namespace

absl::Status CommitManifest(const std::string& checkpoint_path,
                            const v1::CheckpointManifest& manifest, CrashPoints* crash_points,
                            const std::function<absl::Status()>& may_commit) {
  MaybeCrash(crash_points, kCrashManifestBeforeWrite);
  return WriteJsonAtomically(checkpoint_path, kManifest, manifest, crash_points,
                             kCrashManifestBeforeRename, kCrashManifestBeforeDirSync, may_commit);
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& checkpoint_path) {
  v1::CheckpointManifest manifest;
  PS_RETURN_IF_ERROR(
      ReadJson(absl::StrCat(checkpoint_path, "/", kManifest), "committed manifest", &manifest));
  return manifest;
}

absl::StatusOr<v1::CheckpointManifest> ParseManifest(absl::string_view json,
                                                     const std::string& path) {
  v1::CheckpointManifest manifest;
  PS_RETURN_IF_ERROR(ParseJson(json, path, "committed manifest", &manifest));
  return manifest;
}

absl::Status WriteRecoveryIntent(const std::string& dir, const v1::RecoveryIntent& intent) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return WriteJsonAtomically(dir, kRecoveryIntent, intent, nullptr, nullptr, nullptr);
}

absl::StatusOr<v1::RecoveryIntent> ReadRecoveryIntent(const std::string& dir) {
  v1::RecoveryIntent intent;
  PS_RETURN_IF_ERROR(ReadJson(absl::StrCat(dir, "/", kRecoveryIntent), "recovery record", &intent));
  return intent;
}

absl::StatusOr<int64_t> ReadChiefEpoch(const std::string& dir) {
  int64_t last = 0;
  const std::string path = absl::StrCat(dir, "/", kChiefEpoch);
  if (std::ifstream in(path); in) {
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &last)) {
      return absl::DataLossError(absl::StrCat(path, " does not hold a number: \"", text, "\""));
    }
  }
  return last;
}

absl::StatusOr<int64_t> NextChiefEpoch(const std::string& dir, int64_t at_least) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  PS_ASSIGN_OR_RETURN(const int64_t last, ReadChiefEpoch(dir));
  const int64_t epoch = std::max(at_least, last + 1);
  PS_RETURN_IF_ERROR(
      WriteFileAtomically(dir, kChiefEpoch, absl::StrCat(epoch, "\n"), nullptr, nullptr, nullptr));
  return epoch;
}

absl::Status ClearRecoveryIntent(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kRecoveryIntent);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat("cannot delete ", path, ": ", strerror(errno)));
  }
  return SyncPath(dir, /*directory=*/true);
}

absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> found;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return std::vector<std::string>();
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::pair<int64_t, int64_t> order;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !ParseName(name, &order)) continue;
    if (std::filesystem::exists(entry.path() / kManifest)) {
      found.emplace_back(order, entry.path().string());
    }
  }
  if (ec) return absl::UnavailableError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [order, path] : found) out.push_back(std::move(path));
  return out;
}

absl::Status PruneCheckpoints(const std::string& dir, int keep) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> committed, ListCheckpoints(dir));
  std::error_code ec;
  const size_t kept = std::min(static_cast<size_t>(std::max(keep, 1)), committed.size());
  // The checkpoints the kept ones build on stay too.
  std::set<std::string> needed;
  for (size_t i = 0; i < kept; ++i) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(committed[i]);
    if (m.ok()) needed.insert(m->chain().begin(), m->chain().end());
  }
  for (size_t i = kept; i < committed.size(); ++i) {
    if (needed.count(std::filesystem::path(committed[i]).filename().string()) > 0) continue;
    std::filesystem::remove_all(committed[i], ec);
  }
  if (committed.empty()) return absl::OkStatus();
  std::pair<int64_t, int64_t> newest;
  ParseName(std::filesystem::path(committed[0]).filename().string(), &newest);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::pair<int64_t, int64_t> order;
    if (entry.is_directory() && ParseName(entry.path().filename().string(), &order) &&
        order < newest && !std::filesystem::exists(entry.path() / kManifest)) {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpoint(const std::string& checkpoint_path) {
  PS_ASSIGN_OR_RETURN(const std::vector<ChainLink> chain, ReadChain(checkpoint_path));
  CheckpointReaders readers;
  for (const ChainLink& link : chain) {
    for (const v1::SavedShard& saved : link.manifest.shards()) {
      PS_ASSIGN_OR_RETURN(CheckpointReader * reader, readers.For(link.path, saved));
      if (saved.is_table()) {
        PS_RETURN_IF_ERROR(reader->ReadTable(saved, [](int64_t, const float*, int64_t) {}));
        PS_RETURN_IF_ERROR(reader->ReadTableRemoved(saved).status());
      } else {
        PS_RETURN_IF_ERROR(reader->ReadDense(saved).status());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster
