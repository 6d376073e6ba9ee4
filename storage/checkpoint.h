#ifndef PSCLUSTER_STORAGE_CHECKPOINT_H_
#define PSCLUSTER_STORAGE_CHECKPOINT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/default_init_allocator.h"
#include "common/thread_pool.h"
#include "proto/coordinator_service.pb.h"
#include "proto/ps_service.pb.h"
#include "rocksdb/db.h"
#include "storage/crash_points.h"

namespace pscluster {

// Checkpoints on disk:
//
//   <checkpoint_dir>/ckpt-<step, 10 digits>[.<sequence>]/
//       ps-0/ ... ps-<N-1>/   one RocksDB per ps task that wrote shards
//       MANIFEST.json         committed last; without it the checkpoint does not exist
//
// A dense partition is one record "d/<variable>/<partition>": its update count (8 bytes,
// little-endian) then its values and each optimizer slot (float32). A table's part is one
// record per row, "t/<table>/<key as 8 big-endian bytes, sign bit flipped>" (so rows sort by
// key): an 8-byte word, the row's update count in its low 32 bits and the clock's tick at the
// row's last push (eviction) in its high 32 (PackRowCount; 0 in checkpoints of tables without
// eviction, and in those written before it existed), then its values and slots. Each shard's CRC-32
// (zlib) over its records' keys and values, in key order, is kept in the manifest and checked on
// every read. A table with admission also has one record "s/<table>": its count-min sketch's
// 16-bit counters, little-endian, checked against SavedShard.sketch_checksum.
//
// An incremental checkpoint (CheckpointManifest.chain names the checkpoints it builds on, the
// first of them full) holds, per table part (SavedShard.delta), only the rows changed since
// the checkpoint before it and, per run, a record "r/<table>/<run, 2 bytes big-endian>": the
// keys removed since, int64 little-endian in increasing order; their count and CRC-32 (over
// the records' keys and values, in order) are SavedShard.removed_keys and removed_checksum. Its
// dense partitions and vocabulary tables are whole. A reader takes the table's rows from the
// chain's full checkpoint, then from each delta in turn (ReadTableChain).

// The 8-byte word before a table row's floats, and its two halves.
inline int64_t PackRowCount(int64_t count, uint32_t last) {
  return static_cast<int64_t>((uint64_t{last} << 32) | static_cast<uint64_t>(count & 0xffffffffLL));
}
inline int64_t UnpackRowCount(int64_t word) { return word & 0xffffffffLL; }
inline uint32_t UnpackRowLast(int64_t word) {
  return static_cast<uint32_t>(static_cast<uint64_t>(word) >> 32);
}

// "ckpt-0000000120"; with a sequence > 0, "ckpt-0000000120.<sequence>": a later checkpoint of
// the same global step (ASYNC: updates applied since, without the step moving). Listed after
// (newer than) the lower sequences of its step.
std::string CheckpointDirName(int64_t step, int64_t sequence = 0);

// Writes one ps task's shards into <checkpoint_path>/ps-<index>. Thread-compatible.
class CheckpointWriter {
 public:
  // `crash_points` (not owned, may be null) is for fault-injection tests. INVALID_ARGUMENT when
  // ps-<index> is a symbolic link (it is written nowhere but in the checkpoint).
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Open(
      const std::string& checkpoint_path, int ps_index, CrashPoints* crash_points = nullptr);
  ~CheckpointWriter();

  absl::StatusOr<v1::SavedShard> WriteDense(const v1::DenseShardSpec& spec, int64_t updates,
                                            const std::vector<float>& values_and_slots);
  // rows holds keys.size() rows of `stride` floats (values then slots); counts the update
  // count of each row.
  absl::StatusOr<v1::SavedShard> WriteTable(const v1::TableSpec& spec, std::vector<int64_t> keys,
                                            absl::Span<const float> rows,
                                            absl::Span<const int64_t> counts, int64_t stride);
  // One sorted run's rows for WriteTableRuns: keys.size() rows of `stride` floats, in any order
  // (the writer sorts them), and for a delta the keys removed (any order, repeats allowed).
  struct TableRun {
    absl::Span<const int64_t> keys;
    absl::Span<const int64_t> counts;
    absl::Span<const float> rows;
    absl::Span<const int64_t> removed;
  };
  // As WriteTable, for a table given in `runs` parts (at most kMaxRuns): next(r), called for r
  // = 0, 1, ... in turn, gives part r's rows, which are sorted and written before next(r + 1)
  // is called, so only one part need be held at a time (SavedShard.runs). The keys of all
  // parts must be distinct. An error of next is returned as it is. With `delta`, the part is an
  // incremental checkpoint's: each run's removed keys are written too, sorted, once each, as
  // the run's removed-keys record (SavedShard.delta).
  //
  // With `pool` (not owned; threads and more than one run), the runs are written in as many
  // ranges as it has threads and one, each range on a thread of its own into a table file of
  // its own: next is then called from several threads at once, each calling it for its runs in
  // turn, and what it returns must stay valid until the same thread calls it again (a caller
  // keeps a set of buffers a thread). The checkpoint is the same either way, but for how its
  // records are spread over files.
  static constexpr int kMaxRuns = 1 << 16;
  absl::StatusOr<v1::SavedShard> WriteTableRuns(
      const v1::TableSpec& spec, int64_t stride, int runs,
      const std::function<absl::StatusOr<TableRun>(int run)>& next, bool delta = false,
      ThreadPool* pool = nullptr);
  // Adds the admission sketch of the table part `saved` (from WriteTable) and the virtual
  // shards its writer owns to the checkpoint, recording them in *saved.
  absl::Status WriteTableSketch(const std::vector<uint16_t>& counters,
                                const std::vector<int32_t>& virtual_shards, v1::SavedShard* saved);
  // Makes the table part `saved` (from WriteTable) a delta of an incremental checkpoint:
  // records `removed`, the keys removed since the checkpoint it builds on (any order, repeats
  // allowed: written sorted, once each), as one run's record, and sets saved's delta fields.
  absl::Status WriteTableRemoved(std::vector<int64_t> removed, v1::SavedShard* saved);
  // Flushes and syncs everything written; call once, last.
  absl::Status Finish();

 private:
  CheckpointWriter(std::string file, std::string path, const rocksdb::Options& options,
                   std::unique_ptr<rocksdb::DB> db, CrashPoints* crash_points);
  void Written();  // after each shard's records
  // WriteTable (runs == 0: one run, no run in the keys) and WriteTableRuns.
  absl::StatusOr<v1::SavedShard> WriteTableParts(
      const v1::TableSpec& spec, int64_t stride, int runs,
      const std::function<absl::StatusOr<TableRun>(int run)>& next, bool delta, ThreadPool* pool);
  // Runs [begin, end) of a table part (WriteTableParts with runs == 0 writes [0, 1)) into
  // table files of their own, named after `tag`, not taken in yet, and fills *out (but its
  // status); gives up (CANCELLED) at the next run once `failed` is set.
  struct RangeWritten {
    absl::Status status;                   // WriteRange's
    std::string table_file, removed_file;  // empty: nothing of the kind written
    uint32_t crc = 0, removed_crc = 0;     // CRC-32 of the records, and the bytes it covers
    uint64_t crc_bytes = 0, removed_crc_bytes = 0;
    int64_t bytes = 0, total = 0, removed_total = 0;
  };
  absl::Status WriteRange(const v1::TableSpec& spec, int64_t stride, int runs, int begin, int end,
                          const std::function<absl::StatusOr<TableRun>(int run)>& next, bool delta,
                          const std::string& tag, const std::atomic<bool>& failed,
                          RangeWritten* out);

  const std::string file_;  // "ps-3"
  const std::string path_;  // <checkpoint>/ps-3
  const rocksdb::Options options_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_options_;
  CrashPoints* const crash_points_;  // Not owned; may be null.
  int64_t shards_written_ = 0;
};

struct DenseRecord {
  int64_t updates = 0;
  std::vector<float> values_and_slots;
};

// The decoding of stored records, apart from RocksDB: what CheckpointReader does with the bytes
// it reads (public for tests and fuzzing). `path` names the shard file in errors.
//
// A dense partition's record, `key` and `value` as stored. DATA_LOSS naming the file and the
// shard when they fail `saved.checksum()` or the value is not an 8-byte update count followed
// by whole float32s.
absl::StatusOr<DenseRecord> DecodeDenseRecord(const std::string& path, const v1::SavedShard& saved,
                                              absl::string_view key, absl::string_view value);

// Rows per record of the table parts CheckpointWriter writes (SavedShard.row_block): a block's
// value is its row count n (int64), then n keys (int64), n update counts (int64) and n rows of
// `stride` floats, its key the prefix and its first row's key (EncodeKey).
inline constexpr int kRowBlock = 1024;

// A table part's records, fed one by one in key order (the keys that start with
// TablePartDecoder::Prefix(saved)): blocks of rows when saved.row_block() > 0, else one row per
// record (checkpoints written before blocks). Thread-compatible.
class TablePartDecoder {
 public:
  // Makes room for min(saved.rows(), reserve_rows) rows at once (the manifest's count is not
  // checked before the rows are read: the caller bounds it, e.g. by the bytes on disk); beyond,
  // the buffers grow as rows come.
  TablePartDecoder(std::string path, const v1::SavedShard& saved,
                   int64_t reserve_rows = int64_t{1} << 16);

  // The key prefix of the table's rows: "t/<table>/".
  static std::string Prefix(const v1::SavedShard& saved);

  // One record. DATA_LOSS naming the file and table when it is malformed: a key that is not the
  // prefix and 8 bytes, a value that is not an 8-byte update count and whole float32s, or a
  // row of another length than the first; a block of no rows or more than row_block, whose
  // size does not match its rows, whose keys are not in increasing order (from the last
  // block's of its run), or whose first key is not its record's; with runs, a key without its
  // run, or a run out of range or before the last block's.
  // REQUIRES: key starts with Prefix(saved).
  absl::Status Add(absl::string_view key, absl::string_view value);

  // After the last record: checks the checksum and the row count against `saved` (DATA_LOSS),
  // then calls fn(key, row, updates, stride) for every row, in order; `row` holds `stride`
  // floats (values then slots).
  absl::Status Finish(
      const std::function<void(int64_t key, const float* row, int64_t t, int64_t stride)>& fn);

  // Floats per row (values then slots) of the rows added so far; -1 before the first.
  int64_t stride() const { return stride_; }

  // As Finish, but hands over the rows whole instead of one by one: row i is (*keys)[i], its
  // update count (*counts)[i] and its stride() floats at (*values)[i * stride()]. The decoder
  // is empty afterwards.
  absl::Status Take(std::vector<int64_t>* keys, std::vector<int64_t>* counts,
                    UninitializedFloats* values);

  // Rows decoded and not handed out yet.
  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  // Rows decoded so far (handed out or not), and the CRC-32 of the records added so far and
  // the bytes it covers: a part decoded in pieces by several decoders (each from a run of its
  // own on) is checked by combining theirs (PartChecksumError).
  int64_t rows() const { return rows_taken_ + size(); }
  uint32_t crc() const { return crc_; }
  uint64_t crc_bytes() const { return crc_bytes_; }
  // Hands over the rows decoded since the last call, as Take does but before the part's last
  // record and without its checks: they are not verified until Take or Finish (which then
  // count them) succeeds. The vectors given are emptied and kept for the next rows, so a
  // part read a batch at a time reuses two sets of buffers. DATA_LOSS when more rows have come
  // than the manifest's count.
  absl::Status TakeDecoded(std::vector<int64_t>* keys, std::vector<int64_t>* counts,
                           UninitializedFloats* values);

 private:
  absl::Status AddRow(absl::string_view key, absl::string_view value);
  absl::Status AddBlock(absl::string_view key, absl::string_view value);
  absl::Status Malformed(const std::string& what) const;
  // Finish's and Take's check: the checksum and the row count against the manifest's.
  absl::Status Check() const;

  const std::string path_;
  const v1::SavedShard& saved_;
  const std::string prefix_;
  uint32_t crc_ = 0;
  uint64_t crc_bytes_ = 0;
  int64_t stride_ = -1;
  // With runs (saved.runs() > 0): the run of the last block and where its rows begin in keys_.
  int run_ = -1;
  // The last key decoded (of run_ in a part of runs), which the next must be above.
  bool have_last_ = false;
  int64_t last_key_ = 0;
  // Rows handed out by TakeDecoded.
  int64_t rows_taken_ = 0;
  std::vector<int64_t> keys_, counts_;
  UninitializedFloats values_;  // grown by each record, then written: not zero-filled first
};

// Reads shards from one RocksDB of a checkpoint, read-only. Thread-compatible.
class CheckpointReader {
 public:
  // `db_path` is <checkpoint_path>/<SavedShard.file>. NOT_FOUND / DATA_LOSS naming it;
  // INVALID_ARGUMENT when it is a symbolic link.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& db_path);
  ~CheckpointReader();

  // DATA_LOSS naming the file and shard when the record is missing, short or fails its checksum.
  absl::StatusOr<DenseRecord> ReadDense(const v1::SavedShard& saved);
  // Calls fn for every row of the table part, after its checksum has been verified.
  // With `stride` >= 0, rows of another length than `stride` floats (values and slots) are
  // DATA_LOSS naming the file, the table and both lengths, and fn is not called.
  absl::Status ReadTable(const v1::SavedShard& saved,
                         const std::function<void(int64_t key, const float* row, int64_t t)>& fn,
                         int64_t stride = -1);
  // As ReadTable, with each row's length in floats (its values and optimizer slots) given to fn.
  absl::Status ReadTableRows(
      const v1::SavedShard& saved,
      const std::function<void(int64_t key, const float* row, int64_t t, int64_t stride)>& fn,
      int64_t stride = -1);
  // A table part's rows at once (TablePartDecoder::Take, the same checks as ReadTableRows):
  // no copy beyond reading them.
  struct TableRows {
    std::vector<int64_t> keys, counts;
    UninitializedFloats values;
    int64_t stride = 0;  // floats per row (values then slots); 0 when there is no row
  };
  absl::StatusOr<TableRows> ReadTableWhole(const v1::SavedShard& saved, int64_t stride = -1);
  // As ReadTableWhole, a batch of about `batch_rows` rows at a time, in key order (run after
  // run), so that a part of any size is read through two batches' memory: fn gets each batch
  // (it may change it; its buffers are reused for the next) and an error from it ends the read
  // and is returned.
  // The checks are ReadTableWhole's, but the checksum and the row count can only be checked
  // after the last record: every batch but the last is handed over before it, so a caller must
  // be able to drop what it did with them when this returns an error (a restore puts them in a
  // table that is adopted only on success). The last batch comes once the part checked out.
  //
  // With `pool` (not owned) and a part written in runs, a known stride (>= 0) and a pool of
  // threads, the runs are read in as many ranges as the pool has threads and one, each on a
  // thread of its own: fn is then called from several threads at once (with a batch of each),
  // every batch before the part's checksum is known, and the checksum is the ranges' CRCs
  // combined.
  absl::Status ReadTableBatches(const v1::SavedShard& saved, int64_t stride, int64_t batch_rows,
                                const std::function<absl::Status(TableRows& batch)>& fn,
                                ThreadPool* pool = nullptr);
  // The admission sketch of a table part: empty if none was saved (sketch_counters 0); DATA_LOSS
  // naming the file and table when the record is missing, of another size or fails its
  // checksum.
  absl::StatusOr<std::vector<uint16_t>> ReadTableSketch(const v1::SavedShard& saved);
  // The keys removed of a delta table part, run after run, increasing within each (empty if it
  // is not a delta or none were); DATA_LOSS naming the file and table when the records do not
  // add up to removed_keys, fail their checksum, or are out of order.
  absl::StatusOr<std::vector<int64_t>> ReadTableRemoved(const v1::SavedShard& saved);

 private:
  CheckpointReader(std::string path, std::unique_ptr<rocksdb::DB> db);
  // Feeds every record of the part to `decoder` and checks its stride against `stride`.
  absl::Status Decode(const v1::SavedShard& saved, int64_t stride, TablePartDecoder* decoder);
  // Calls fn(key, value) for every record of the table part, in key order; an error of fn
  // ends it and is returned. Only the records from `from` (a key) on and before `to` (empty:
  // to the end of the part) when they are given.
  absl::Status ForEachRecord(
      const v1::SavedShard& saved,
      const std::function<absl::Status(absl::string_view key, absl::string_view value)>& fn,
      const std::string& from = "", const std::string& to = "");
  // ReadTableBatches over the part's runs in ranges, one per thread of `pool`.
  absl::Status ReadTableBatchesInRanges(const v1::SavedShard& saved, int64_t stride,
                                        int64_t batch_rows,
                                        const std::function<absl::Status(TableRows& batch)>& fn,
                                        ThreadPool* pool);
  // DATA_LOSS naming both lengths when the decoder's rows are not of `stride` floats (when
  // stride >= 0 and it has had rows).
  absl::Status CheckStride(const v1::SavedShard& saved, const TablePartDecoder& decoder,
                           int64_t stride) const;
  // A decoder for `saved`, its buffers sized for the rows the part's bytes on disk can hold.
  TablePartDecoder DecoderFor(const v1::SavedShard& saved);

  const std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
};

// The shard files of checkpoints, each opened once (by its path) when first asked for.
// Thread-compatible.
class CheckpointReaders {
 public:
  // The reader of <checkpoint_path>/<saved.file()>; errors as CheckpointReader::Open.
  absl::StatusOr<CheckpointReader*> For(const std::string& checkpoint_path,
                                        const v1::SavedShard& saved);

 private:
  std::map<std::string, std::unique_ptr<CheckpointReader>> readers_;
};

// One checkpoint's parts of a table, for ReadTableChain.
struct TableLink {
  std::string checkpoint_path;
  std::vector<const v1::SavedShard*> parts;
};

// A table's rows as a chain of checkpoints gives them (`links`, oldest first): the parts of
// the last link whose parts are all whole (not SavedShard.delta), then, for each later link,
// its removed keys taken out and its rows put over. Only the rows whose key `keep` accepts
// (every row when it is null), in no particular order; counts as saved (PackRowCount); rows of
// another stride than `stride` (when >= 0) are DATA_LOSS, as in ReadTableWhole. DATA_LOSS also
// when no link is whole, or a link after it mixes whole and delta parts.
absl::StatusOr<CheckpointReader::TableRows> ReadTableChain(
    const std::vector<TableLink>& links, int64_t stride,
    const std::function<bool(int64_t key)>& keep, CheckpointReaders* readers);

// What ReadTableChainBatches hands out, in order.
struct TableChainSink {
  // Rows to put in, over any row of the same key (ReadTableBatches's batches, unverified until
  // their part's last batch came: see there).
  std::function<absl::Status(CheckpointReader::TableRows& batch)> put;
  // Keys to take out (a delta part's removed keys, increasing), before that part's rows.
  std::function<absl::Status(const std::vector<int64_t>& keys)> remove;
};

// ReadTableChain as a stream, for a reader that holds the rows itself (a restore's table): the
// rows of the chain's base link (the last one written whole) are put, then for each later link
// and each of its parts, the part's removed keys are removed and its rows put. Rows of every
// key come, `keep` being the sink's business; DATA_LOSS as ReadTableChain, and for a part that
// fails its checks after some of its batches were put (the sink must then drop what it built).
// An error of the sink ends it and is returned. With `pool`, each part is read as
// CheckpointReader::ReadTableBatches reads it with a pool (sink.put called from its threads).
absl::Status ReadTableChainBatches(const std::vector<TableLink>& links, int64_t stride,
                                   int64_t batch_rows, const TableChainSink& sink,
                                   CheckpointReaders* readers, ThreadPool* pool = nullptr);

// A committed checkpoint and its manifest.
struct ChainLink {
  std::string path;
  v1::CheckpointManifest manifest;
};
// What a restore of the checkpoint at `checkpoint_path` reads: the checkpoints its manifest's
// chain names (in the same directory), oldest first, then itself. A full checkpoint is a chain
// of one. NOT_FOUND / DATA_LOSS from ReadManifest for `checkpoint_path`; DATA_LOSS naming the
// link when one is not committed, does not parse, or does not build on the links before it
// (its own chain must be their names).
absl::StatusOr<std::vector<ChainLink>> ReadChain(const std::string& checkpoint_path);

// Commits a checkpoint: MANIFEST.json.tmp written and fsynced, renamed to MANIFEST.json, the
// directory fsynced. A crash at any point leaves either no manifest or the whole one.
// `crash_points` (not owned, may be null) is for fault-injection tests. `may_commit`, when
// given, is asked just before the rename; an error from it is returned, with nothing committed.
absl::Status CommitManifest(const std::string& checkpoint_path,
                            const v1::CheckpointManifest& manifest,
                            CrashPoints* crash_points = nullptr,
                            const std::function<absl::Status()>& may_commit = nullptr);
// NOT_FOUND when the checkpoint has no committed manifest; DATA_LOSS when it does not parse.
absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& checkpoint_path);
// Parses the contents of a MANIFEST.json; DATA_LOSS naming `path` when it does not parse.
absl::StatusOr<v1::CheckpointManifest> ParseManifest(absl::string_view json,
                                                     const std::string& path);

// The recovery record (RecoveryIntent) of a checkpoint directory: <dir>/RECOVERY.json.
// WriteRecoveryIntent replaces it atomically (a temporary file synced, renamed, the directory
// synced); ReadRecoveryIntent gives NOT_FOUND when there is none and DATA_LOSS when it does not
// parse; ClearRecoveryIntent removes it (OK if absent) and syncs the directory.
absl::Status WriteRecoveryIntent(const std::string& dir, const v1::RecoveryIntent& intent);
absl::StatusOr<v1::RecoveryIntent> ReadRecoveryIntent(const std::string& dir);
absl::Status ClearRecoveryIntent(const std::string& dir);

// The fencing epoch of a chief that starts with checkpoints in `dir`: max(at_least, the epoch
// recorded in <dir>/CHIEF_EPOCH + 1), recorded there (atomically) before it is returned, so
// every chief of the cluster has a higher epoch than the one before, even if the clock went
// back. DATA_LOSS if the file holds something else than a number.
absl::StatusOr<int64_t> NextChiefEpoch(const std::string& dir, int64_t at_least);
// The newest chief epoch recorded in `dir` (0 when none is).
absl::StatusOr<int64_t> ReadChiefEpoch(const std::string& dir);

// Paths of the committed checkpoints under `dir`, newest (highest step, then highest sequence)
// first.
absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& dir);

// Deletes all but the newest `keep` committed checkpoints and those their chains build on,
// and any uncommitted checkpoint directory older than the newest committed one (a crashed
// write).
absl::Status PruneCheckpoints(const std::string& dir, int keep);

// Verifies every shard of a committed checkpoint, and of the checkpoints its chain builds on,
// against its checksum. OK, or the first DATA_LOSS / NOT_FOUND.
absl::Status VerifyCheckpoint(const std::string& checkpoint_path);

}  // namespace pscluster

#endif  // PSCLUSTER_STORAGE_CHECKPOINT_H_
