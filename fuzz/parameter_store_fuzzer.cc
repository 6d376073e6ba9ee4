// Fuzzes ParameterStore (ps_server/parameter_store.h), the ps task's transport-free core, with a
// sequence of requests decoded from the input: create (dense shards, tables), dense push and
// pull, sparse push and pull, save (with the checkpoint read back), list and inspect.
//
// Input (fuzz/fuzz_input.h): a byte of store options (bit 0: allow NaN/Inf gradients), then up
// to 48 operations, each an opcode byte (% 8) and its fields; small fields are one byte in a
// small range, so that the operations meet the same few variables ("a", "b") and tables
// ("e", "f") again; a field byte of 0xFF is followed by a wide value (any int64) instead.
//
// Invariants:
//   - no operation crashes, whatever its fields;
//   - a refused request changes nothing: every shard's and table's counters, values, slots'
//     statistics and rows (ListShards, Inspect) are the same before and after it;
//   - a dense pull gives each shard's element count; a sparse pull gives n * dim values;
//   - a save writes shards that read back and verify (CommitManifest, VerifyCheckpoint), and
//     that restore into another ps task (shards from the input) or are refused, changing
//     nothing;
//   - a second save may be incremental on the first (SaveShardsRequest.delta_base, changes
//     tracked from the first cut or not, the base named right or not): refused with
//     FAILED_PRECONDITION, changing nothing, or written as a delta that verifies through its
//     chain and restores (full + delta) into a ps task of the same shards exactly as a full
//     checkpoint taken at the same moment restores into another.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/coordinator_service.pb.h"
#include "proto/ps_service.pb.h"
#include "ps_server/parameter_store.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

constexpr int kMaxOps = 48;
constexpr int64_t kMemoryBudget = 1 << 20;

// A field: one byte, `lo + byte % (hi - lo + 1)`; 0xFF: the next 8 bytes as an int64.
int64_t Field(FuzzInput& in, int lo, int hi) {
  const uint8_t b = in.Int<uint8_t>();
  if (b == 0xFF) return in.Int<int64_t>();
  return lo + b % (hi - lo + 1);
}

std::string VariableName(FuzzInput& in) {
  const int64_t pick = Field(in, 0, 3);
  if (pick == 0) return "a";
  if (pick == 1) return "b";
  if (pick == 2) return "";
  return in.Short();
}

std::string TableName(FuzzInput& in) {
  const int64_t pick = Field(in, 0, 3);
  if (pick == 0) return "e";
  if (pick == 1) return "f";
  if (pick == 2) return "";
  return in.Short();
}

v1::DataType Dtype(FuzzInput& in) {
  const int64_t pick = Field(in, 0, 4);
  static constexpr v1::DataType kDtypes[] = {v1::DT_INVALID, v1::DT_FLOAT32, v1::DT_FLOAT16,
                                             v1::DT_BFLOAT16, v1::DT_INT64};
  if (pick >= 0 && pick < 5) return kDtypes[pick];
  return static_cast<v1::DataType>(static_cast<int32_t>(pick));
}

void Optimizer(FuzzInput& in, v1::OptimizerSpec* optimizer) {
  const float lr = static_cast<float>(Field(in, 0, 4)) / 4;
  switch (Field(in, 0, 6)) {
    case 0:
      optimizer->mutable_sgd()->set_learning_rate(lr);
      break;
    case 1:
      optimizer->mutable_momentum()->set_learning_rate(lr);
      break;
    case 2:
      optimizer->mutable_adagrad()->set_learning_rate(lr);
      break;
    case 3:
      optimizer->mutable_adam()->set_learning_rate(lr);
      break;
    case 4:
      optimizer->mutable_ftrl()->set_learning_rate(lr);
      break;
    case 5:
      optimizer->mutable_rmsprop()->set_learning_rate(lr);
      break;
    default:
      break;  // none set
  }
}

void Initializer(FuzzInput& in, v1::InitializerSpec* init) {
  init->set_kind(static_cast<v1::InitializerSpec::Kind>(Field(in, 0, 6)));
  init->set_value(static_cast<float>(Field(in, -2, 2)));
  init->set_min(-1);
  init->set_max(static_cast<float>(Field(in, -1, 1)));
  init->set_stddev(static_cast<float>(Field(in, -1, 1)));
  init->set_seed(in.Int<uint8_t>());
}

// `message` as bytes, its map fields in key order: plain serialization writes a map in its
// hash order, which two equal maps need not share (found by this fuzzer: ListShards'
// dropped_by_worker came out in two orders with nothing changed).
std::string DeterministicBytes(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

// Everything a request may change, as bytes: ListShards, and Inspect of every shard (all its
// values) and of every table (the rows of every key used so far).
class Snapshot {
 public:
  Snapshot(ParameterStore& store, const std::set<int64_t>& keys) : keys_(keys) {
    const v1::ListShardsResponse list = store.ListShards();
    for (const v1::ShardStats& shard : list.shards()) {
      v1::InspectShardRequest request;
      request.mutable_shard()->set_variable(shard.name());
      request.mutable_shard()->set_partition(shard.partition());
      if (shard.is_table()) {
        for (int64_t key : keys) request.add_keys(key);
      } else {
        request.set_values_count(std::numeric_limits<int64_t>::max());
      }
      absl::StatusOr<v1::InspectShardResponse> inspected = store.Inspect(request);
      FUZZ_CHECK(inspected.ok(), "Inspect of listed shard ", shard.name(), "/", shard.partition(),
                 ": ", inspected.status().ToString());
      // The stats' doubles of identical values are identical, NaN included, as bytes.
      absl::StrAppend(&state_, DeterministicBytes(*inspected));
    }
    // Listed last: Inspect applies complete sync steps first, which moves the counters.
    absl::StrAppend(&state_, DeterministicBytes(store.ListShards()));
  }
  bool operator==(const Snapshot& other) const { return state_ == other.state_; }
  const std::set<int64_t>& keys() const { return keys_; }

 private:
  const std::set<int64_t> keys_;
  std::string state_;
};

class VectorSink : public DensePullSink {
 public:
  absl::Status Begin(const std::vector<int64_t>& n) override {
    sizes = n;
    values.assign(n.size(), {});
    return absl::OkStatus();
  }
  absl::Status Values(int index, const float* v, int64_t n) override {
    FUZZ_CHECK(index >= 0 && index < static_cast<int>(sizes.size()), "shard index ", index);
    FUZZ_CHECK(n == sizes[index], "shard ", index, ": ", n, " values, announced ", sizes[index]);
    values[index].assign(v, v + n);
    return absl::OkStatus();
  }
  std::vector<int64_t> sizes;
  std::vector<std::vector<float>> values;
};

class Session {
 public:
  Session(FuzzInput& in, const std::string& scratch) : in_(in), scratch_(scratch) {
    ParameterStoreOptions options;
    options.allow_non_finite = in.Bool();
    options.memory_budget_bytes = kMemoryBudget;
    options.max_sparse_keys = 64;
    options.max_sparse_bytes = 4096;
    options.push_ids_per_client = 8;
    options.max_push_clients = 4;
    store_ = std::make_unique<ParameterStore>(options);
  }

  void Run() {
    for (int op = 0; op < kMaxOps && !in_.empty(); ++op) {
      const int code = in_.Small(0, 7);
      if (code == 7) {
        List();
        continue;
      }
      const Snapshot before(*store_, keys_);
      absl::Status s;
      switch (code) {
        case 0:
          s = CreateDense();
          break;
        case 1:
          s = CreateTable();
          break;
        case 2:
          s = PushDense();
          break;
        case 3:
          s = PullDense();
          break;
        case 4:
          s = PushSparse();
          break;
        case 5:
          s = PullSparse();
          break;
        default:
          s = Save();
          break;
      }
      if (!s.ok()) {
        FUZZ_CHECK(!s.message().empty(), "op ", code, " refused with no message");
        // The same keys as before: the request may have added some to keys_.
        FUZZ_CHECK(Snapshot(*store_, before.keys()) == before, "op ", code, " was refused (",
                   s.ToString(), ") but changed the store");
      }
    }
  }

 private:
  absl::Status CreateDense() {
    v1::CreateShardsRequest request;
    const int n = in_.Small(1, 2);
    for (int i = 0; i < n; ++i) {
      v1::DenseShardSpec* spec = request.add_dense();
      v1::VariableSpec* var = spec->mutable_variable();
      var->set_name(VariableName(in_));
      const int rank = in_.Small(0, 2);
      for (int d = 0; d < rank; ++d) var->mutable_shape()->add_dims(Field(in_, -1, 6));
      var->set_dtype(in_.Small(0, 7) == 0 ? v1::DT_FLOAT16 : v1::DT_FLOAT32);
      Initializer(in_, var->mutable_initializer());
      Optimizer(in_, var->mutable_optimizer());
      v1::DensePartition* part = spec->mutable_partition();
      part->set_variable(in_.Small(0, 7) == 0 ? "other" : var->name());
      part->set_partition(Field(in_, -1, 2));
      part->set_num_partitions(Field(in_, 0, 3));
      part->set_row_begin(Field(in_, -1, 3));
      part->set_row_end(Field(in_, -1, 6));
    }
    SetSync(&request);
    return Create(request);
  }

  absl::Status CreateTable() {
    v1::CreateShardsRequest request;
    v1::TableShardSpec* spec = request.add_tables();
    spec->mutable_table()->set_name(TableName(in_));
    spec->mutable_table()->set_dim(Field(in_, -1, 4));
    Initializer(in_, spec->mutable_table()->mutable_initializer());
    Optimizer(in_, spec->mutable_table()->mutable_optimizer());
    spec->set_num_virtual_shards(Field(in_, -1, 4));
    const int owned = in_.Small(0, 4);
    for (int i = 0; i < owned; ++i) spec->add_virtual_shards(Field(in_, -1, 4));
    SetSync(&request);
    return Create(request);
  }

  // Creates on the store, keeping the requests that succeed for ReplayCreates.
  absl::Status Create(const v1::CreateShardsRequest& request) {
    v1::CreateShardsResponse response;
    const absl::Status s = store_->CreateShards(request, &response);
    if (s.ok() && !restoring_elsewhere_) creates_.push_back(request);
    return s;
  }

  // A new ps task with the shards this session's store was given.
  std::unique_ptr<ParameterStore> ReplayCreates() {
    auto store = std::make_unique<ParameterStore>(store_->options());
    for (const v1::CreateShardsRequest& request : creates_) {
      v1::CreateShardsResponse response;
      const absl::Status s = store->CreateShards(request, &response);
      FUZZ_CHECK(s.ok(), "a create that succeeded once failed on a new ps task: ", s.ToString());
    }
    return store;
  }

  void SetSync(v1::CreateShardsRequest* request) {
    const int mode = in_.Small(0, 7);  // mostly ASYNC, else SYNC or SSP
    request->mutable_sync()->set_mode(mode < 5 ? v1::ASYNC : mode < 7 ? v1::SYNC : v1::SSP);
    request->mutable_sync()->set_replicas_to_aggregate(Field(in_, 0, 2));
    request->set_start_step(Field(in_, 0, 2));
  }

  void RefsInto(google::protobuf::RepeatedPtrField<v1::ShardRef>* refs, int n) {
    for (int i = 0; i < n; ++i) {
      v1::ShardRef* ref = refs->Add();
      ref->set_variable(VariableName(in_));
      ref->set_partition(Field(in_, -1, 2));
    }
  }

  void RequestId(v1::RequestId* id) {
    if (!in_.Bool()) return;
    id->set_client(Field(in_, 0, 3));
    id->set_seq(Field(in_, 0, 7));
  }

  absl::Status PushDense() {
    v1::PushDenseHeader header;
    const int n = in_.Small(0, 2);
    RefsInto(header.mutable_shards(), n);
    // Element counts: mostly the shard's own (so that pushes get through), else fuzzed.
    const int counts = n + (in_.Small(0, 15) == 0 ? 1 : 0);  // one too many, at times
    for (int i = 0; i < counts; ++i) {
      header.add_num_elements(Field(in_, -1, 24));
    }
    header.set_wire_dtype(Dtype(in_));
    header.set_step(Field(in_, -1, 3));
    header.set_worker(Field(in_, 0, 2));
    RequestId(header.mutable_request_id());
    DensePush push;
    PS_RETURN_IF_ERROR(store_->StartPushDense(header, &push));
    // Chunks: each (shard index, offset, bytes), until a stop marker.
    const int chunks = in_.Small(0, 4);
    for (int c = 0; c < chunks; ++c) {
      const int index = static_cast<int>(Field(in_, -1, 2));
      const int64_t offset = Field(in_, -1, 24);
      const std::string bytes = in_.Short();
      if (index < 0 || index >= push.num_shards()) {
        // Only valid indices are the transport's to pass (it checks them against the header).
        continue;
      }
      PS_RETURN_IF_ERROR(push.AddChunk(index, offset, bytes));
    }
    v1::PushDenseResponse response;
    return store_->FinishPushDense(&push, &response);
  }

  absl::Status PullDense() {
    v1::PullDenseRequest request;
    RefsInto(request.mutable_shards(), in_.Small(0, 2));
    request.set_wire_dtype(Dtype(in_));
    if (in_.Bool()) request.set_step(Field(in_, -1, 3));
    VectorSink sink;
    absl::Status s = store_->PullDense(request, &sink);
    if (s.ok()) {
      FUZZ_CHECK(sink.sizes.size() == static_cast<size_t>(request.shards_size()), sink.sizes.size(),
                 " shards pulled of ", request.shards_size());
    }
    return s;
  }

  std::vector<int64_t> Keys() {
    std::vector<int64_t> keys(in_.Small(0, 6));
    for (int64_t& key : keys) {
      key = Field(in_, -3, 12);
      keys_.insert(key);
    }
    return keys;
  }

  absl::Status PushSparse() {
    v1::PushSparseRequest request;
    request.set_table(TableName(in_));
    const std::vector<int64_t> keys = Keys();
    request.set_wire_dtype(Dtype(in_));
    request.set_step(Field(in_, -1, 3));
    request.set_worker(Field(in_, 0, 2));
    RequestId(request.mutable_request_id());
    request.set_num_keys(static_cast<int64_t>(keys.size()));
    const std::string gradients = in_.Short();
    v1::PushSparseResponse response;
    return store_->PushSparse(request, keys.data(), static_cast<int64_t>(keys.size()), gradients,
                              &response);
  }

  absl::Status PullSparse() {
    v1::PullSparseRequest request;
    request.set_table(TableName(in_));
    const std::vector<int64_t> keys = Keys();
    request.set_wire_dtype(Dtype(in_));
    if (in_.Bool()) request.set_step(Field(in_, -1, 3));
    std::vector<float> rows;
    absl::Status s =
        store_->PullSparse(request, keys.data(), static_cast<int64_t>(keys.size()), &rows);
    if (s.ok()) {
      absl::StatusOr<int64_t> dim = store_->TableDim(request.table());
      FUZZ_CHECK(dim.ok(), "pulled from table ", request.table(), " that has no dim");
      FUZZ_CHECK(static_cast<int64_t>(rows.size()) == *dim * static_cast<int64_t>(keys.size()),
                 rows.size(), " values for ", keys.size(), " keys of dim ", *dim);
    }
    return s;
  }

  static constexpr char kFirst[] = "ckpt-0000000001";
  static constexpr char kSecond[] = "ckpt-0000000002";
  static constexpr char kWhole[] = "ckpt-0000000003";

  // At most two saves per input (RocksDB makes them the slowest operations by far): the first
  // full, the second full or incremental on the first.
  absl::Status Save() {
    if (saves_ >= 2) return absl::OkStatus();
    const bool second = ++saves_ == 2;
    const std::string path = absl::StrCat(scratch_, "/", second ? kSecond : kFirst);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    v1::SaveShardsRequest request;
    request.set_checkpoint_path(path);
    request.set_step(Field(in_, 0, 3));
    request.set_track_changes(in_.Bool());
    if (second) {
      const int64_t base = Field(in_, 0, 2);
      if (base == 1) request.set_delta_base(kFirst);
      if (base == 2) request.set_delta_base("ckpt-0000000009");
    }
    v1::SaveShardsResponse response;
    absl::Status s;
    if (in_.Bool()) {
      // In two halves, as the chief saves: the memory made first or not, the cut, the write.
      if (in_.Bool()) {
        v1::SaveShardsRequest prepare;
        prepare.set_phase(v1::SAVE_PREPARE);
        FUZZ_CHECK(store_->Save(prepare, &response).ok(), "SAVE_PREPARE failed");
      }
      request.set_phase(v1::SAVE_CUT);
      s = store_->Save(request, &response);
      if (s.ok()) {
        request.set_phase(v1::SAVE_AWAIT);
        s = store_->Save(request, &response);
      }
    } else {
      s = store_->Save(request, &response);
    }
    if (!request.delta_base().empty() && !s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kFailedPrecondition,
                 "an incremental save refused with ", s.ToString());
    }
    // A delta on a first save whose cut was taken but whose write failed has no full
    // checkpoint under it (the chief starts a new chain after such a save): not checked.
    const bool delta = !request.delta_base().empty();
    if (s.ok() && (!delta || first_ok_)) {
      v1::CheckpointManifest manifest;
      manifest.set_step(request.step());
      manifest.set_num_ps(1);
      if (delta) manifest.add_chain(kFirst);
      *manifest.mutable_shards() = response.shards();
      FUZZ_CHECK(CommitManifest(path, manifest).ok(), "cannot commit a manifest");
      const absl::Status verified = VerifyCheckpoint(path);
      std::string names;
      for (const v1::SavedShard& shard : response.shards()) {
        absl::StrAppend(&names, " \"", absl::CHexEscape(shard.name()), "\"");
      }
      FUZZ_CHECK(verified.ok(), "a checkpoint just saved (shards", names,
                 delta ? ", incremental" : "",
                 ") does not verify: ", absl::CHexEscape(verified.ToString()));
      if (delta) {
        CheckDeltaRestores(path, request.step(), response);
      } else if (in_.Bool()) {
        RestoreElsewhere(path, request.step(), response);
      }
    }
    if (!s.ok() || second) std::filesystem::remove_all(path);
    if (second) std::filesystem::remove_all(absl::StrCat(scratch_, "/", kFirst));
    if (s.ok() && !second) {
      first_ = response;
      first_ok_ = true;
    }
    return s;
  }

  // The incremental checkpoint at `path` (on kFirst, whose response is first_) restored into a
  // new ps task of this store's shards holds exactly what a full checkpoint of the same moment
  // restored into another holds.
  void CheckDeltaRestores(const std::string& path, int64_t step,
                          const v1::SaveShardsResponse& saved) {
    const std::string whole_path = absl::StrCat(scratch_, "/", kWhole);
    std::filesystem::remove_all(whole_path);
    std::filesystem::create_directories(whole_path);
    v1::SaveShardsRequest request;
    request.set_checkpoint_path(whole_path);
    request.set_step(step);
    v1::SaveShardsResponse whole;
    const absl::Status s = store_->Save(request, &whole);
    FUZZ_CHECK(s.ok(), "a full save right after an incremental one failed: ", s.ToString());

    v1::RestoreShardsRequest chain;
    chain.set_checkpoint_path(path);
    *chain.mutable_saved() = saved.shards();
    chain.set_step(step);
    v1::CheckpointLink* link = chain.add_chain();
    link->set_checkpoint_path(absl::StrCat(scratch_, "/", kFirst));
    *link->mutable_saved() = first_.shards();
    v1::RestoreShardsRequest full;
    full.set_checkpoint_path(whole_path);
    *full.mutable_saved() = whole.shards();
    full.set_step(step);
    std::unique_ptr<ParameterStore> from_chain = ReplayCreates();
    std::unique_ptr<ParameterStore> from_full = ReplayCreates();
    v1::RestoreShardsResponse response;
    const absl::Status chain_status = from_chain->Restore(chain, &response);
    const absl::Status full_status = from_full->Restore(full, &response);
    FUZZ_CHECK(chain_status.ok() == full_status.ok(),
               "restores of the same moment: ", chain_status.ToString(), " from full + delta, ",
               full_status.ToString(), " from the full checkpoint");
    FUZZ_CHECK(Snapshot(*from_chain, keys_) == Snapshot(*from_full, keys_),
               "full + delta restored other values than the full checkpoint of the same moment");
    std::filesystem::remove_all(whole_path);
  }

  // Restores the checkpoint at `path` into a new ps task whose shards come from the input (as
  // after a restart with another model config or number of ps tasks), then goes back to the
  // first one. A refused restore changes nothing.
  void RestoreElsewhere(const std::string& path, int64_t step,
                        const v1::SaveShardsResponse& saved) {
    std::unique_ptr<ParameterStore> first = std::move(store_);
    store_ = std::make_unique<ParameterStore>(first->options());
    restoring_elsewhere_ = true;
    const int creates = in_.Small(0, 3);
    for (int i = 0; i < creates; ++i) {
      absl::Status s = in_.Bool() ? CreateTable() : CreateDense();
      s.IgnoreError();  // refused creates are checked in Run()
    }
    restoring_elsewhere_ = false;
    v1::RestoreShardsRequest request;
    request.set_checkpoint_path(path);
    *request.mutable_saved() = saved.shards();
    request.set_step(step);
    const Snapshot before(*store_, keys_);
    v1::RestoreShardsResponse response;
    const absl::Status s = store_->Restore(request, &response);
    if (!s.ok()) {
      FUZZ_CHECK(Snapshot(*store_, before.keys()) == before, "a refused restore (", s.ToString(),
                 ") changed the store");
    } else {
      // Rows of one width cannot be restored into a table of another.
      for (const v1::SavedShard& shard : saved.shards()) {
        if (!shard.is_table()) continue;
        absl::StatusOr<int64_t> dim = store_->TableDim(shard.name());
        FUZZ_CHECK(!dim.ok() || *dim == shard.table().dim(), "table ", shard.name(), " of dim ",
                   *dim, " restored from a checkpoint of dim ", shard.table().dim());
      }
    }
    store_ = std::move(first);
  }

  void List() {
    const v1::ListShardsResponse list = store_->ListShards();
    for (const v1::ShardStats& shard : list.shards()) {
      FUZZ_CHECK(shard.bytes() >= 0 && shard.pushes() >= 0 && shard.pulls() >= 0,
                 shard.ShortDebugString());
    }
    v1::InspectShardRequest request;
    request.mutable_shard()->set_variable(VariableName(in_));
    request.mutable_shard()->set_partition(Field(in_, -1, 2));
    request.set_values_offset(Field(in_, -1, 8));
    request.set_values_count(Field(in_, -1, 8));
    store_->Inspect(request).IgnoreError();
  }

  FuzzInput& in_;
  const std::string scratch_;
  std::unique_ptr<ParameterStore> store_;
  std::set<int64_t> keys_;  // every sparse key used, for the snapshots
  int saves_ = 0;
  v1::SaveShardsResponse first_;  // the first save's, while kFirst is on disk
  bool first_ok_ = false;
  std::vector<v1::CreateShardsRequest> creates_;  // that succeeded on store_
  bool restoring_elsewhere_ = false;              // store_ is RestoreElsewhere's
};

// A directory of this process for checkpoints, removed at exit.
const std::string& Scratch() {
  static const std::string* dir = [] {
    std::string templ = (std::filesystem::temp_directory_path() / "ps_fuzz_XXXXXX").string();
    FUZZ_CHECK(mkdtemp(templ.data()) != nullptr, "mkdtemp ", templ);
    auto* path = new std::string(templ);
    std::atexit([] { std::filesystem::remove_all(Scratch()); });
    return path;
  }();
  return *dir;
}

}  // namespace
}  // namespace pscluster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pscluster::FuzzInput in(data, size);
  pscluster::Session session(in, pscluster::Scratch());
  session.Run();
  return 0;
}
