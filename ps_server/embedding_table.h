#ifndef PSCLUSTER_PS_SERVER_EMBEDDING_TABLE_H_
#define PSCLUSTER_PS_SERVER_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/huge_page_pool.h"
#include "proto/model.pb.h"
#include "proto/ps_service.pb.h"
#include "ps_server/admission_filter.h"
#include "ps_server/eviction_policy.h"
#include "ps_server/hot_key_sketch.h"
#include "ps_server/optimizer.h"
#include "ps_server/row_arena.h"
#include "ps_server/row_index.h"
#include "ps_server/vocabulary_rows.h"
#include "sharding/sparse_hash.h"

namespace pscluster {

class ThreadPool;

// OK, or INVALID_ARGUMENT naming the table and the field, if spec's admission or eviction is out
// of range: admission.min_count not in [0, 65535], probability not in [0, 1], sketch_width
// negative or over 2^26; eviction ttl_steps, ttl_seconds, max_rows or max_bytes negative or past
// 2^32 (the TTLs), both TTLs set, or max_bytes smaller than one row per stripe.
absl::Status ValidateAdmissionAndEviction(const v1::TableSpec& spec);

// One ps task's part of a sparse embedding table: int64 key -> a row of dim() floats, plus the
// optimizer's slots for that row and the row's update count `t` (the 1-based step number that
// Optimizer::Apply receives, which Adam's bias correction uses). Counts saturate at 2^32 - 1
// (RowIndex::kMaxCount), where 1 - beta^t is 1 in float for any beta < 1 - 1e-8.
//
// The task owns some of the table's virtual shards (sharding/sparse_hash.h); a key whose virtual
// shard is not among them is refused with FAILED_PRECONDITION, because a request that reaches
// the wrong task means the client's placement and the server's disagree.
//
// A row is created on first touch (Pull or Push) with the values InitializeRow gives for
// (table initializer, table name, key), so a row's initial values do not depend on which task
// creates it or when; its slots start at the optimizer's slot_initial_value and its count at 0.
//
// Admission (spec.admission set, model.proto's AdmissionSpec): a key without a row is pulled as
// its initial values, creating nothing, and its pushes are counted (an AdmissionFilter per
// stripe) and dropped until one admits it: that push creates the row and is applied. Whether a
// push admits depends only on the key and its count, so the same sequence of pushes admits the
// same keys.
//
// With admission or eviction, only pushes create rows; a pull of a key without a row gives
// the key's initial values, so reads (an evaluator's) neither fill the table nor make it evict.
//
// Eviction (spec.eviction set): every row remembers when it was last pushed, in ticks of the
// table's clock: the highest step ObserveStep has seen, or, with ttl_seconds, Unix seconds. A
// row older than the TTL behaves as removed at once (pulled as its initial values; a push
// starts it again from them, count 0, after admitting it again if the table admits) and is
// removed by a sweep of its stripe; a stripe over its share of the capacity (max_rows or
// max_bytes over kNumStripes) after a push removes rows down to 15/16 of it, least recently
// pushed (LRU) or least updated (LFU) first: EvictionPolicy says when and which, from the rows'
// contents, not where they lie in memory, so a restored table evicts as the original would (a
// push of more new keys than that may so lose some of its own new rows; a sync step's mean is
// applied at the tick of its step, whenever it is settled). The work is one pass over the
// stripe's index under its lock, at most once per 1/16 of its share of new rows. The arena's
// freed rows are reused by new ones.
//
// A vocabulary table (spec.vocabulary_size() > 0, model.proto) takes only keys in
// [0, vocabulary_size): a key's virtual shard is the key mod num_virtual_shards
// (VirtualShardOfTableKey), and the task reserves, when the table is created, its rows numbered
// by key and an update count per row (VocabularyRows). A push or pull computes a key's row
// instead of looking it up, so each key costs one random row, not an index entry and a row.
// Everything else is as for a hashed table: rows created on first touch with the same initial
// values, the same updates bit for bit, the same checkpoints (ForEachRow, InsertRow). A key
// outside the range is refused with INVALID_ARGUMENT. Counts saturate at 2^32 - 2.
//
// Memory: each stripe's rows are in a RowArena, blocks of 32-64 KiB that do not move once the
// stripe has one full block, and its index is a RowIndex; both come from HugePagePool, whose
// 2 MiB slabs are transparent huge pages, so that a large table's random rows and index entries
// do not also miss the TLB (a push to a 10-million-row table takes about a quarter less time
// per key for it; docs/benchmarks_history.md, session 12).
//
// Every request is validated whole before anything changes: a refused Pull, Push or InsertRow
// creates no row and updates none.
//
// Thread-safety: thread-safe. Rows are spread over kNumStripes stripes by a hash of the key that
// is independent of the virtual-shard hash (so a task that owns few virtual shards still uses
// every stripe); each stripe has its own lock, map and storage. A request takes each stripe's
// lock at most twice (Pull: once shared, once exclusive if it creates rows). A reader sees a
// whole row update or none of it; a request touching several stripes is not atomic across
// them (another thread may see some of its rows updated and others not yet). Pull and Push of
// at least kMinParallelKeys keys, given a ThreadPool, work on several stripes at once.
//
// Lifecycle: none; usable from Create until destroyed.
class EmbeddingTable {
 public:
  // Number of lock stripes.
  static constexpr int kNumStripes = 64;
  // Rows of an admission sketch (count-min).
  static constexpr int kSketchRows = AdmissionFilter::kRows;
  // Counters kept by the hot-key sketch; HotKeys returns at most this many keys.
  static constexpr int kHotKeyCounters = HotKeySketch::kCounters;
  // Requests of fewer keys than this run on the calling thread alone.
  static constexpr int64_t kMinParallelKeys = 4096;

  // Creates an empty table for `spec` that owns `owned_virtual_shards` of the table's
  // num_virtual_shards virtual shards (duplicates are ignored; an empty list owns no key).
  // INVALID_ARGUMENT, naming the value, if spec.name() is empty, spec.dim() is not in
  // [1, 2^31), the initializer or the optimizer is invalid (or unset: the optimizer has no
  // default), the admission or eviction spec is out of range (ValidateAdmissionAndEviction),
  // num_virtual_shards <= 0, or an owned shard is not in [0, num_virtual_shards); for a
  // vocabulary table also if vocabulary_size is past 2^48 or admission or eviction is set, and
  // RESOURCE_EXHAUSTED if its rows cannot be allocated.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(
      const v1::TableSpec& spec, std::vector<int32_t> owned_virtual_shards,
      int32_t num_virtual_shards);

  // The bytes Create reserves up front for a task owning `num_owned` of num_virtual_shards
  // virtual shards: a vocabulary table's rows and counts; 0 for a hashed table, which grows.
  // Errors as Create's for the spec.
  static absl::StatusOr<int64_t> ReservedBytes(const v1::TableSpec& spec, int64_t num_owned,
                                               int32_t num_virtual_shards);

  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;
  ~EmbeddingTable();

  const v1::TableSpec& spec() const { return spec_; }
  int64_t dim() const { return dim_; }
  const Optimizer& optimizer() const { return *optimizer_; }

  // Whether the last-push ticks of rows saved by a table of spec `saved` mean what this
  // table's do (both track them, in steps or both in seconds), and the tick of `step` on this
  // table's clock (with ttl_seconds: now), for rows whose saved ticks do not.
  bool TicksComparable(const v1::TableSpec& saved) const;
  uint32_t TickOf(int64_t step) const { return Now(step); }

  // Whether a pull creates the rows it does not find (neither admission nor eviction), and
  // whether the table has a capacity (eviction.max_rows or max_bytes).
  bool pulls_create_rows() const { return !admission_ && !tracks_last_; }
  bool has_capacity() const { return eviction_.capacity() > 0; }

  // True if `key` hashes to a virtual shard this table owns (and, in a vocabulary table, is in
  // [0, vocabulary_size)).
  bool OwnsKey(int64_t key) const;
  bool is_vocabulary() const { return vocabulary_size_ > 0; }

  // Moves the table's step clock (eviction by steps, LRU) to `step` if it is higher; negative
  // steps are ignored. Thread-safe; call before the push of that step. Only pushes move it:
  // reads (an evaluator's pulls) must not age the model.
  void ObserveStep(int64_t step);

  // Counts since the table was created (or last cleared): rows created by pulls and pushes,
  // rows removed for capacity, rows removed or restarted for their TTL, and pushed keys counted
  // but not admitted.
  struct Counts {
    int64_t admitted = 0;
    int64_t evicted = 0;
    int64_t expired = 0;
    int64_t unadmitted = 0;
  };
  Counts counts() const;

  // Writes the row of keys[i] to out[i*dim, (i+1)*dim) for i in [0, n), creating rows on first
  // touch (without admission and eviction; with either, the initial values of a key without a
  // row, creating nothing). Duplicate keys are fine.
  // FAILED_PRECONDITION if a key is not owned ("key K of table T hashes to virtual shard V, not
  // held by this ps task: placement mismatch"), INVALID_ARGUMENT if n < 0 or, in a vocabulary
  // table, a key is outside [0, vocabulary_size); either way before anything changes.
  // With a non-null `pool` (not owned), a large request's stripes are read on its threads too.
  // A TTL is judged at the clock, which only pushes move, or, when `step` is not negative (with
  // ttl_steps), at `step`: in sync mode, the step the pull is for, so that a pull sees the same
  // rows whether or not a faster worker has already pushed that step (and in a replay). (In
  // async mode pushes carry each worker's own step, which a pull's step is not comparable to.)
  // REQUIRES: keys holds n keys and out n*dim() floats (both may be null when n == 0). Not owned.
  absl::Status Pull(const int64_t* keys, int64_t n, float* out, ThreadPool* pool = nullptr,
                    int64_t step = -1);

  // Applies gradient grads[i*dim, (i+1)*dim) to the row of keys[i], for i in [0, n). The
  // gradients of a key that appears several times are summed first (in order of position), then
  // each distinct row gets exactly one optimizer update with t = its update count + 1, created
  // on first touch. Rows not pushed are untouched, slots included.
  // Validated before anything changes: FAILED_PRECONDITION for an unowned key (as Pull);
  // INVALID_ARGUMENT if n < 0, or, unless allow_non_finite, for the first NaN or Inf gradient
  // element, naming the table, the key, its position and the value.
  // (RESOURCE_EXHAUSTED if a stripe would pass 2^32 rows, about 2^38 rows in the table, is the
  // one error found late: stripes already updated by the request then stay updated.)
  // `pool` as for Pull. The result does not depend on it: each row's update is the same.
  // REQUIRES: keys holds n keys and grads n*dim() floats (both may be null when n == 0).
  absl::Status Push(const int64_t* keys, int64_t n, const float* grads, bool allow_non_finite,
                    ThreadPool* pool = nullptr);

  // Push in two halves, for callers that validate before deciding how to apply (a sync
  // accumulator): CheckPush returns the errors Push would, changing nothing; ApplyPush then
  // applies without checking again (only RESOURCE_EXHAUSTED, as Push). CheckPush scans a large
  // request's gradients on `pool`'s threads too, when given one.
  absl::Status CheckPush(const int64_t* keys, int64_t n, const float* grads, bool allow_non_finite,
                         ThreadPool* pool = nullptr) const;
  // `step`, when not negative, is the tick at which a TTL is judged and which the pushed rows
  // are stamped with (with ttl_steps; ignored with ttl_seconds), instead of the clock: a sync
  // step's mean, applied whenever it is settled.
  // Samples the keys for HotKeys, unless `sample_hot_keys` is false (a part of a push applied
  // in pieces, whose caller samples it once, whole: SampleHotKeys).
  // REQUIRES: CheckPush(keys, n, grads, ...) returned OK.
  absl::Status ApplyPush(const int64_t* keys, int64_t n, const float* grads,
                         ThreadPool* pool = nullptr, int64_t step = -1,
                         bool sample_hot_keys = true);
  // Counts a push's keys into the hot-key sketch (a bounded sample of them, per call).
  void SampleHotKeys(const int64_t* keys, int64_t n) { hot_keys_.SamplePush(keys, n); }

  // Reads without creating. For each keys[i], in order: if its row exists (on this table; an
  // unowned key never does), appends the key to *found and its dim() values to *rows; otherwise
  // appends the key to *missing. Does not clear the vectors.
  // REQUIRES: found, rows and missing are non-null. Not owned.
  void Lookup(const int64_t* keys, int64_t n, std::vector<int64_t>* found, std::vector<float>* rows,
              std::vector<int64_t>* missing) const;

  // Number of rows the table holds (resident).
  int64_t num_rows() const;

  // The stripe of a key: of a hashed table, the top bits of MixKey (independent of the virtual
  // shard); of a vocabulary table, its shard's (VocabularyRows::StripeOf). A row's updates are
  // ordered by its stripe's lock (replication numbers a push's parts by it).
  int StripeOf(int64_t key) const;

  // Memory estimate, in bytes, of what the rows hold: num_rows() * row_bytes(). The index's
  // empty entries (it is at most 3/4 full), freed rows and vector slack are not counted. A
  // vocabulary table holds every row of its shards from the start: reserved_bytes().
  int64_t bytes() const;
  // (1 + num_slots) * dim floats, a 16-byte index entry (key, row number, update count) and,
  // with eviction, the 4-byte tick of the row's last push; in a vocabulary table, the floats
  // and a 4-byte count.
  int64_t row_bytes() const;
  // ReservedBytes for this table.
  int64_t reserved_bytes() const;

  // The most pushed keys, most first (ties by key), at most min(k, kHotKeyCounters) of them:
  // a HotKeySketch fed by every successful Push (approximate; see there). Empty for k <= 0.
  std::vector<v1::HotKey> HotKeys(int k) const { return hot_keys_.Top(k); }

  // Fills *stats over the values of every row (not the slots), accumulated in double:
  // count, min, max, mean, std (population), l2_norm over the finite values; NaN and Inf are
  // counted in nan_count and inf_count and left out of the rest (as ComputeFloatStats in
  // dense_shard.h). min/max/mean/std/l2_norm are 0 when no value is finite. Stripes are read one
  // after another, so concurrent pushes may be partly included.
  // REQUIRES: stats is non-null. Not owned.
  void ComputeValueStats(v1::ValueStats* stats) const;

  // For checkpoints: calls fn(key, values_and_slots, t, last) once for every row, where
  // values_and_slots holds (1 + num_slots) * dim floats: the dim values, then each slot's dim
  // floats, and last is the clock's tick at the row's last push (0 without eviction). Rows
  // past their TTL are left out (as removed), swept or not. Each stripe
  // is copied under its lock and fn runs on the copy with no lock held, so fn may call back into
  // the table; the rows of one stripe are a consistent snapshot, rows of different stripes may be
  // from different moments. The pointer is valid only during the call.
  void ForEachRow(const std::function<void(int64_t key, const float* values_and_slots, int64_t t,
                                           uint32_t last)>& fn) const;

  // A copy of the rows for a checkpoint's cut (CopyRows): row i is keys[i], with update count
  // counts[i], last-push tick last[i] (0 without eviction) and its (1 + num_slots) * dim floats
  // at rows[i * stride]. The floats are on huge pages (HugePageAllocator): a cut of gigabytes
  // faults in 2 MiB pages, not 4 KiB ones.
  struct RowsCopy {
    std::vector<int64_t> keys, counts;
    std::vector<uint32_t> last;
    std::vector<float, HugePageAllocator<float>> rows;

    // Makes room for `n` rows of `stride` floats and faults it in (written once, then emptied:
    // the room stays), so that a copy into it only copies. REQUIRES: empty.
    void MakeRoom(size_t n, size_t stride);
  };
  // Appends the rows ForEachRow would give to *out, each stripe under its lock, straight into
  // vectors sized for num_rows() more rows first: one copy of each row, no regrowth (a cut
  // holds the pushes while it copies).
  // REQUIRES: out is non-null. Not owned.
  void CopyRows(RowsCopy* out) const;
  // CopyRows for stripe `stripe` alone, and of its rows only those whose key `keep` takes
  // (replication's rebuild copies a backup's virtual shards stripe by stripe: ParameterStore).
  // REQUIRES: 0 <= stripe < kNumStripes; out non-null.
  void CopyStripeRows(int stripe, const std::function<bool(int64_t key)>& keep,
                      RowsCopy* out) const;

  // A checkpoint's cut without a copy (copy-on-write), for a hashed table (a vocabulary
  // table's rows are copied at the cut: CopyRows). MarkCut records the rows as they are now,
  // copying nothing; from then on the first change of a row (an update, a removal, a restore
  // over it) first keeps the row's state at the mark aside in its stripe. TakeStripeCut(s, out)
  // appends stripe s's rows as they were at the mark (what CopyRows gave then, its stripe-s
  // part, in no particular order, rows past their TTL at the mark left out) to *out and drops
  // what the stripe kept, so that the memory a cut holds is the rows changed in the stripes not
  // taken yet. A stripe is taken once; rows created after the mark are not in the cut. A mark
  // with stripes not taken is replaced by the next MarkCut; DropCut drops it (a failed save).
  //
  // Incremental cuts: a mark with `track_changes` has the stripes record, until the next mark,
  // which rows get a key or new values and which keys are removed. The next mark can then be
  // a `delta`: TakeStripeCut gives only the rows changed between the two marks (as they were
  // at the second) and appends to *removed the keys removed between them and those past their
  // TTL at the second (a key may be both removed and given: removed, then made again).
  // ChangesTracked() tells whether a delta mark is possible: every change since the last mark
  // was recorded (it tracked changes and the table was not cleared since).
  // REQUIRES: !is_vocabulary() for MarkCut; ChangesTracked() for a delta; 0 <= stripe <
  // kNumStripes; out non-null, and removed non-null for a delta.
  void MarkCut(bool delta = false, bool track_changes = false);
  bool ChangesTracked() const;
  //
  // TakeStripeCut copies the stripe's unchanged rows under its shared lock (pulls of rows that
  // exist go on meanwhile), `chunk_rows` at a time, letting go of the lock for a moment between
  // chunks, and at once (every kCutYieldRows rows) when a push or a row-creating pull waits for
  // it: a push into a stripe being taken waits for a few hundred rows' copy, not the stripe's
  // (every push of many keys needs every stripe: with whole stripes copied under the lock it
  // followed the writer from stripe to stripe). A row changed while the lock is let go is kept
  // aside as any change of a marked row is, unless its chunk was copied already (then the cut
  // has it, and nothing is kept).
  static constexpr int64_t kCutChunkRows = 16384;
  static constexpr int64_t kCutYieldRows = 256;
  void TakeStripeCut(int stripe, RowsCopy* out, std::vector<int64_t>* removed = nullptr,
                     int64_t chunk_rows = kCutChunkRows, int64_t yield_rows = kCutYieldRows);
  void DropCut();
  // Rows kept aside for the mark's stripes not taken yet.
  int64_t cut_kept_rows() const;

  // Inserts, or overwrites, the row of `key` with values_and_slots ((1 + num_slots) * dim
  // floats, laid out as in ForEachRow), update count t (for restore; a t past
  // RowIndex::kMaxCount is kept as kMaxCount) and last-push tick `last` (kept with eviction
  // only; with a TTL in steps, the step clock moves to it if it is higher). Nothing is evicted: a
  // restore may leave a stripe over its capacity until its next push. FAILED_PRECONDITION if the
  // key is not owned (as Pull); INVALID_ARGUMENT if t < 0. REQUIRES: values_and_slots holds (1 +
  // num_slots) * dim floats. Not owned.
  absl::Status InsertRow(int64_t key, const float* values_and_slots, int64_t t, uint32_t last = 0);

  // InsertRow for n rows at once (a restore): row i is keys[i] with values_and_slots[i * (1 +
  // num_slots) * dim, ...), update count t[i] and last-push tick last[i]. Checked first, nothing
  // changed on an error: FAILED_PRECONDITION for the first key not owned, INVALID_ARGUMENT for
  // the first negative count. Then each stripe's rows go in under one hold of its lock, its
  // index sized for them first; the stripes on `pool`'s threads too when it is given (not
  // owned). A key given twice keeps its last row. (RESOURCE_EXHAUSTED if a stripe would pass
  // 2^32 rows is found late, as in Push.)
  absl::Status InsertRows(const int64_t* keys, const float* values_and_slots, const int64_t* t,
                          const uint32_t* last, int64_t n, ThreadPool* pool = nullptr);

  // Removes the rows of those of keys[0, n) that have one here (a restore of a chain: the keys
  // a delta recorded as removed); keys not owned or without a row are passed over. Not for a
  // vocabulary table (it does nothing there).
  void RemoveRows(const int64_t* keys, int64_t n);

  // For checkpoints: the admission sketch's counters, stripe after stripe (empty without
  // admission), and the virtual shards this table owns, in increasing order.
  std::vector<uint16_t> AdmissionSketch() const;
  // AdmissionSketch().size(), without the copy.
  int64_t admission_sketch_size() const { return kNumStripes * kSketchRows * sketch_width_; }
  std::vector<int32_t> OwnedVirtualShards() const;
  // Adds `counters` (an AdmissionSketch() of a table with the same sketch width) to this
  // table's counters, saturating: a restore gives a task the counts of the parts whose keys it
  // now owns. INVALID_ARGUMENT, changing nothing, if the size differs.
  absl::Status MergeAdmissionSketch(const std::vector<uint16_t>& counters);

  // Removes every row and the admission counts, and sets the step clock to 0 (for a restore:
  // rows created after the checkpoint must not survive it; touched again, a key gets its
  // initial values, as in the run the checkpoint came from; InsertRow then moves the clock to
  // the restored rows' newest push). Stripe by stripe: call while no request is under way.
  void Clear();

  // An empty table of the same spec and virtual shards, to restore into while this one serves
  // (then AdoptRows). Errors as Create's (none for a table Create made).
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmptyLike() const;
  // Clear, then takes the rows of `staged` (an EmptyLike of this table that a restore filled
  // with InsertRows) and its step clock, leaving it empty: each stripe's rows change hands
  // under its lock, with no copy. The admission counts are cleared as Clear clears them (the
  // restore merges the checkpoint's after). FAILED_PRECONDITION, changing nothing, if either is
  // a vocabulary table or `staged` has another stride or other virtual shards.
  absl::Status AdoptRows(EmbeddingTable& staged);

 private:
  // One lock stripe: row r's stride_ floats at arena.Row(r), where the values are
  // the first dim floats and slot s the dim floats at offset (1 + s) * dim; the row's entry in
  // `rows` holds its key and t. Removed rows' numbers wait in free_rows for new ones.
  // A stripe's part of a mark (MarkCut) not taken yet: which rows changed since, and their
  // state at the mark.
  struct StripeCut {
    uint32_t rows_at_cut = 0;    // arena rows at the mark; rows numbered from here are newer
    uint32_t now = 0;            // the clock's tick at the mark
    std::vector<uint64_t> kept;  // bit r: row r's state at the mark is in `rows` (or it was free)
    // While TakeStripeCut copies the stripe in chunks: bit r, row r's state at the mark is in
    // the copy already (a change then keeps nothing aside).
    std::vector<uint64_t> taken;
    RowsCopy rows;  // rows that were live at the mark, as they were
    // An incremental cut (MarkCut's delta): only the rows whose bit is set in `changed` (changed
    // between the previous mark and this one) are in it; `removed` holds the keys removed
    // then, and those found past their TTL at this mark.
    bool delta = false;
    std::vector<uint64_t> changed;
    std::vector<int64_t> removed;
  };

  struct alignas(64) Stripe {
    mutable absl::Mutex mu;
    RowIndex rows ABSL_GUARDED_BY(mu);
    RowArena arena ABSL_GUARDED_BY(mu);
    std::vector<uint32_t> free_rows ABSL_GUARDED_BY(mu);
    // With eviction: the tick of each arena row's last push.
    std::vector<uint32_t> last ABSL_GUARDED_BY(mu);
    // With admission: the stripe's counts of pushed keys without rows.
    AdmissionFilter sketch ABSL_GUARDED_BY(mu);
    // With a TTL: the tick of the stripe's last sweep.
    uint32_t swept_at ABSL_GUARDED_BY(mu) = 0;
    // In a vocabulary table: how many of the stripe's rows are created. (The rows and counts
    // are in the table's arrays; the stripe's lock guards those of its keys.)
    int64_t vocabulary_rows ABSL_GUARDED_BY(mu) = 0;
    // A mark not taken yet (MarkCut): every change of a row checks it first.
    std::unique_ptr<StripeCut> cut ABSL_GUARDED_BY(mu);
    // Since the last mark with track_changes (until the next mark, or a Clear): bit r of
    // `changed` is set when row r gets a key or new values; `removed` holds the keys removed.
    bool tracking ABSL_GUARDED_BY(mu) = false;
    std::vector<uint64_t> changed ABSL_GUARDED_BY(mu);
    std::vector<int64_t> removed ABSL_GUARDED_BY(mu);
    // cut != nullptr || tracking: the one test the apply paths make for every row they update
    // (WatchRowLocked). Kept by SetWatchedLocked wherever either changes.
    bool watched ABSL_GUARDED_BY(mu) = false;
    // How many pushes and row-creating pulls are waiting for `mu` (StripeWriterLock): a hint
    // for TakeStripeCut, which lets go of the lock when one is, not a count anything relies on.
    std::atomic<int> writers_waiting{0};
  };

  // The exclusive lock of a stripe for a push or a pull that creates rows: it says that it waits
  // (Stripe::writers_waiting), so that a save's take of the stripe steps aside for it.
  class ABSL_SCOPED_LOCKABLE StripeWriterLock {
   public:
    explicit StripeWriterLock(Stripe* stripe) ABSL_EXCLUSIVE_LOCK_FUNCTION(stripe->mu)
        : stripe_(stripe) {
      stripe_->writers_waiting.fetch_add(1, std::memory_order_relaxed);
      stripe_->mu.Lock();
      stripe_->writers_waiting.fetch_sub(1, std::memory_order_relaxed);
    }
    ~StripeWriterLock() ABSL_UNLOCK_FUNCTION() { stripe_->mu.Unlock(); }
    StripeWriterLock(const StripeWriterLock&) = delete;
    StripeWriterLock& operator=(const StripeWriterLock&) = delete;

   private:
    Stripe* const stripe_;
  };

  // Clear's work on stripe s. REQUIRES: s is the stripe's number.
  void ClearStripeLocked(Stripe* stripe, int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);

  static void SetWatchedLocked(Stripe* stripe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu) {
    stripe->watched = stripe->cut != nullptr || stripe->tracking;
  }
  // Before the first change of `entry`'s row since the stripe's mark, and to record it changed.
  // REQUIRES: stripe->watched.
  void WatchRowLocked(Stripe* stripe, const RowIndex::Entry& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu) {
    if (stripe->cut != nullptr) KeepForCutLocked(stripe, entry);
    if (stripe->tracking) NoteChangedLocked(stripe, entry.row);
  }

  // Records that `row` changed since the last mark. REQUIRES: stripe->tracking.
  static void NoteChangedLocked(Stripe* stripe, uint32_t row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu) {
    const size_t word = row / 64;
    if (word >= stripe->changed.size()) stripe->changed.resize(word + 1 + word / 8, 0);
    stripe->changed[word] |= uint64_t{1} << (row % 64);
  }

  // Before the first change of `entry`'s row since the stripe's mark: keeps the row's state
  // at the mark (if it was live then and not past its TTL). REQUIRES: stripe->cut.
  void KeepForCutLocked(Stripe* stripe, const RowIndex::Entry& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // Before a row free at the mark gets a key: marks it as not in the cut. REQUIRES: stripe->cut.
  void ForgetForCutLocked(Stripe* stripe, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // Appends the rows of `entries` (the stripe's) to *out with their keys, counts and ticks,
  // leaving out rows past their TTL at `now` (as removed). CopyRows' and TakeStripeCut's copy.
  void AppendRowsLocked(const Stripe* stripe, const std::vector<RowIndex::Entry>& entries,
                        uint32_t now, RowsCopy* out) const ABSL_SHARED_LOCKS_REQUIRED(stripe->mu);
  // InsertRow's work on its stripe, under the stripe's lock (no clock moved).
  absl::Status InsertRowLocked(Stripe* stripe, int64_t key, const float* values_and_slots,
                               int64_t t, uint32_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // Keeps every row of the mark not kept yet (before the stripe is cleared).
  void KeepAllForCutLocked(Stripe* stripe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);

  // A request's positions grouped by stripe with a stable counting sort: stripe s holds
  // begin[s + 1] - begin[s] of them, listed in increasing order in order[begin[s], begin[s + 1]).
  struct StripeGroups {
    std::vector<uint8_t> stripe_of;  // The stripe of each position.
    int64_t begin[kNumStripes + 1];
    std::vector<int64_t> order;
  };
  void GroupByStripe(const int64_t* keys, int64_t n, StripeGroups* groups) const;

  // The lookahead of the pipelines that find rows (PullStripe, ApplyStripe): the hash slot of
  // the key kKeyAhead positions on is prefetched, and a row is used kRowLag positions after it
  // was found (and prefetched); kRowRing rows are held in between.
  static constexpr int64_t kKeyAhead = 16;
  static constexpr int64_t kRowLag = 8;
  static constexpr int64_t kRowRing = 16;
  static_assert(kRowRing > kRowLag, "the ring holds the rows in flight");
  // ApplyStripe updates the rows it has found this many at a time (Optimizer::ApplyRows).
  static constexpr int64_t kUpdateBatch = 16;
  // ApplyPlainStripe's update pass prefetches the gradient and the row of the distinct key this
  // many on: the first pass prefetched the rows, but a stripe's rows no longer all fit in L1 by
  // the time they are updated, and it never loads the gradients.
  static constexpr int64_t kUpdateAhead = 48;

  // Calls fn(s) for every stripe s, on `pool` too when it has threads and n (the request's
  // keys) is at least kMinParallelKeys. Each call may run on any thread. Successive calls
  // start kFirstStripeStride stripes apart (odd, so every stripe comes first in turn).
  void ForEachStripe(int64_t n, ThreadPool* pool, const std::function<void(int)>& fn);
  static constexpr uint32_t kFirstStripeStride = 41;
  static absl::Status FirstError(const absl::Status (&status)[kNumStripes]);

  // Pull's work on one stripe: the keys keys[order[0..count)], rows to out[order[i] * dim].
  absl::Status PullStripe(Stripe* stripe, const int64_t* keys, const int64_t* order, int64_t count,
                          float* out, uint32_t now);
  // ApplyPush's work on one stripe: the keys keys[order[0..count)] with gradients
  // grads[order[i] * dim] (repeated keys summed in order of position first). ApplyPlainStripe
  // does the same for a table without admission and eviction, finding each key's row in one
  // pass; ApplyStripe serves every table.
  // kVocabulary: the rows are a vocabulary table's, found by number instead of by the index.
  template <bool kVocabulary>
  absl::Status ApplyPlainStripe(Stripe* stripe, const int64_t* keys, const float* grads,
                                const int64_t* order, int64_t count);
  // Counts an update of `key`'s row (its index entry, or row number in a vocabulary table)
  // and returns the count (its t), prefetching a hashed table's row.
  template <bool kVocabulary>
  uint32_t CountPlainUpdateLocked(Stripe* stripe, RowIndex::Entry* entry, int64_t row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // Finds `key`'s row (*row; *entry its index entry, which a vocabulary table has not),
  // creating it with its initial values if there is none (counted in *created); false, with
  // *status, if it cannot be created.
  template <bool kVocabulary>
  bool FindOrCreatePlainRowLocked(Stripe* stripe, int64_t key, RowIndex::Entry** entry,
                                  int64_t* row, int64_t* created, absl::Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // Applies grads[i] to row rows[i] with update count ts[i], for i in [0, n), kUpdateBatch
  // rows to an ApplyRows call, and clears each row's bit in `seen` (counted from first_row).
  template <bool kVocabulary, typename Grads>
  void UpdatePlainRowsLocked(Stripe* stripe, const int64_t* rows, const Grads& grads,
                             const uint32_t* ts, int64_t n, int64_t first_row, uint64_t* seen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // ApplyStripe's steps, under the stripe's lock. For `key`, which has no row: the entry of its
  // row, created (counted in *admitted) if the table admits the key; null if not admitted, or,
  // with *status, if the row cannot be created.
  RowIndex::Entry* AdmitRowLocked(Stripe* stripe, int64_t key, uint32_t now,
                                  std::vector<AdmissionFilter::Bump>* bumps, int64_t* admitted,
                                  absl::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // A row found past its TTL (as if swept, which the stripe may not have done yet): restarted
  // from its initial values with count 1 if the table admits its key again (true), else
  // removed (false; no later row of the request uses its number).
  bool RestartExpiredRowLocked(Stripe* stripe, int64_t key, uint32_t row, float* values,
                               std::vector<AdmissionFilter::Bump>* bumps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // PullStripe for a vocabulary table.
  absl::Status PullVocabularyStripe(Stripe* stripe, const int64_t* keys, const int64_t* order,
                                    int64_t count, float* out);
  absl::Status ApplyStripe(Stripe* stripe, const int64_t* keys, const float* grads,
                           const int64_t* order, int64_t count, uint32_t now);

  EmbeddingTable(v1::TableSpec spec, std::unique_ptr<Optimizer> optimizer, std::vector<bool> owned,
                 int32_t num_virtual_shards, int64_t stripe_capacity);

  // Initializes a vocabulary table's row of `key` (values and slots) and counts it created.
  absl::Status CreateVocabularyRowLocked(Stripe* stripe, int64_t key, int64_t row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);

  // OK, or FAILED_PRECONDITION naming the first key of keys[0..n) that is not owned
  // (INVALID_ARGUMENT if that key is outside a vocabulary table's range).
  absl::Status CheckOwned(const int64_t* keys, int64_t n, ThreadPool* pool) const;
  absl::Status NotOwnedError(int64_t key) const;

  // Appends the row of `key`, which the stripe does not hold, with its initial values and
  // slots if `initialize` (else unspecified, for the caller to overwrite), count 0 and last
  // push `now`, in a freed row if there is one. Fails, changing nothing, if the stripe holds
  // 2^32 - 1 rows (RESOURCE_EXHAUSTED) or the initializer fails (which Create rules out).
  // Returns the row's index entry, valid until the stripe's next new or removed row.
  absl::StatusOr<RowIndex::Entry*> AppendRowLocked(Stripe* stripe, int64_t key, bool initialize,
                                                   uint32_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // The entry of `key`'s row, appended with its initial values if absent (as AppendRowLocked),
  // or restarted from them if it has expired.
  absl::StatusOr<RowIndex::Entry*> FindOrCreateRowLocked(Stripe* stripe, int64_t key, uint32_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  // Writes the initial values of `key`'s row to values[0, dim) and, if `slots`, the slots'
  // initial values after them.
  absl::Status InitialRow(int64_t key, float* values, bool slots) const;

  // The clock's tick now (see the class comment), or `step` when it is not negative and the TTL
  // is in steps.
  uint32_t Now(int64_t step = -1) const;
  // The TTL sweep and the capacity limit (class comment), after a request that may have added
  // rows.
  void EvictLocked(Stripe* stripe, uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);
  void RemoveRowLocked(Stripe* stripe, int64_t key, uint32_t row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(stripe->mu);

  const v1::TableSpec spec_;
  const int64_t dim_;
  const std::unique_ptr<Optimizer> optimizer_;
  const int num_slots_;
  // Floats per row: (1 + num_slots_) * dim_.
  const int64_t stride_;
  // owned_[v] is true if this table holds virtual shard v.
  const std::vector<bool> owned_;
  const int32_t num_virtual_shards_;

  // Admission (all zero without it).
  const bool admission_;
  const int64_t sketch_width_;  // per stripe; a power of two
  // Eviction (all zero without it).
  const bool tracks_last_;
  const bool ttl_in_seconds_;
  const EvictionPolicy eviction_;  // the TTL in ticks and the capacity in rows per stripe

  std::atomic<uint32_t> step_clock_{0};
  // Where the next ForEachStripe starts: at this mod kNumStripes (it grows by
  // kFirstStripeStride a call; 2^32 is a multiple of kNumStripes, so wrapping keeps the turn).
  std::atomic<uint32_t> next_first_stripe_{0};
  std::atomic<int64_t> admitted_{0}, evicted_{0}, expired_{0}, unadmitted_{0};

  std::unique_ptr<Stripe[]> stripes_;

  // A vocabulary table's ids (0 for a hashed table) and its rows (VocabularyRows).
  const int64_t vocabulary_size_;
  VocabularyRows vocabulary_;

  // Fed by every successful push; its own small lock, never taken with a stripe lock.
  HotKeySketch hot_keys_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_EMBEDDING_TABLE_H_
