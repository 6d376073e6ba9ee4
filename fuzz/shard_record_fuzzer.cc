// Fuzzes the decoding of checkpoint shard records (storage/checkpoint.h: DecodeDenseRecord and
// TablePartDecoder, what CheckpointReader does with the bytes it reads from RocksDB).
//
// Input (fuzz/fuzz_input.h): a byte picking dense (even) or table (odd); the shard's name
// (a length byte, then the bytes); a byte of flags: bit 0 set gives `saved` the records' true
// CRC-32 (else the next 4 bytes are the checksum), bit 1 set the true row count (else the
// next 8 bytes).
//   dense: the partition (int32), then the rest is the record's value.
//   table: the row count (byte % 17), then per row: a byte that, % 8 == 0, makes the key's
//          suffix that byte / 8 % 16 bytes long instead of 8; the suffix; a length byte;
//          the value.
// Invariants: a record is accepted exactly when its checksum and row count match and every
// value is an 8-byte update count and whole float32s, all of one length for a table; an
// accepted record gives back exactly the stored bytes; a refused one is DATA_LOSS naming the
// file.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "proto/ps_service.pb.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

constexpr char kPath[] = "ckpt-0000000001/ps-0";

uint32_t Crc(uint32_t crc, const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

void CheckRefused(const absl::Status& s) {
  FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss && absl::StrContains(s.message(), kPath),
             s.ToString());
}

bool IsRowValue(const std::string& value) {
  return value.size() >= 8 && (value.size() - 8) % 4 == 0;
}

void FuzzDense(FuzzInput& in, v1::SavedShard& saved, uint8_t flags) {
  saved.set_partition(in.Int<int32_t>());
  const uint32_t checksum = (flags & 1) ? 0 : in.Int<uint32_t>();
  const std::string value = in.Rest();
  const std::string key = absl::StrCat("d/", saved.name(), "/", saved.partition());
  const uint32_t crc = Crc(Crc(0, key), value);
  saved.set_checksum((flags & 1) ? crc : checksum);
  absl::StatusOr<DenseRecord> record = DecodeDenseRecord(kPath, saved, key, value);
  const bool valid = saved.checksum() == crc && IsRowValue(value);
  FUZZ_CHECK(record.ok() == valid, value.size(), " bytes: ", record.status().ToString());
  if (!record.ok()) return CheckRefused(record.status());
  FUZZ_CHECK(std::memcmp(&record->updates, value.data(), 8) == 0, "update count changed");
  FUZZ_CHECK(record->values_and_slots.size() * 4 + 8 == value.size(),
             record->values_and_slots.size(), " floats from ", value.size(), " bytes");
  FUZZ_CHECK(
      record->values_and_slots.empty() ||
          std::memcmp(record->values_and_slots.data(), value.data() + 8, value.size() - 8) == 0,
      "values changed");
}

void FuzzTable(FuzzInput& in, v1::SavedShard& saved, uint8_t flags) {
  saved.set_is_table(true);
  saved.set_partition(-1);
  const uint32_t checksum = (flags & 1) ? 0 : in.Int<uint32_t>();
  const int64_t saved_rows = (flags & 2) ? 0 : in.Int<int64_t>();
  const std::string prefix = TablePartDecoder::Prefix(saved);
  FUZZ_CHECK(prefix == absl::StrCat("t/", saved.name(), "/"), prefix);
  const int n = in.Small(0, 16);
  std::vector<std::pair<std::string, std::string>> records;
  uint32_t crc = 0;
  for (int i = 0; i < n; ++i) {
    const uint8_t shape = in.Int<uint8_t>();
    const size_t suffix = shape % 8 == 0 ? shape / 8 % 16 : 8;
    std::string key = prefix + in.Bytes(suffix);
    std::string value = in.Short();
    crc = Crc(Crc(crc, key), value);
    records.emplace_back(std::move(key), std::move(value));
  }
  saved.set_checksum((flags & 1) ? crc : checksum);
  saved.set_rows((flags & 2) ? n : saved_rows);

  // What a correct decoder does.
  bool rows_ok = true;
  for (const auto& [key, value] : records) {
    rows_ok = rows_ok && key.size() == prefix.size() + 8 && IsRowValue(value) &&
              value.size() == records[0].second.size();
  }
  const bool valid = rows_ok && saved.checksum() == crc && saved.rows() == n;

  TablePartDecoder decoder(kPath, saved);
  absl::Status s;
  for (const auto& [key, value] : records) {
    s = decoder.Add(key, value);
    if (!s.ok()) break;
  }
  int64_t calls = 0;
  if (s.ok()) {
    s = decoder.Finish([&](int64_t key, const float* row, int64_t t, int64_t stride) {
      FUZZ_CHECK(calls < n, "more rows than records");
      const auto& [stored_key, value] = records[calls];
      ++calls;
      FUZZ_CHECK(stride * 4 + 8 == static_cast<int64_t>(value.size()), "stride ", stride,
                 " for a value of ", value.size(), " bytes");
      uint64_t u = 0;
      for (int b = 0; b < 8; ++b)
        u = (u << 8) | static_cast<uint8_t>(stored_key[prefix.size() + b]);
      FUZZ_CHECK(key == static_cast<int64_t>(u ^ (uint64_t{1} << 63)), "key ", key);
      FUZZ_CHECK(std::memcmp(&t, value.data(), 8) == 0, "update count changed");
      FUZZ_CHECK(stride == 0 || std::memcmp(row, value.data() + 8, stride * 4) == 0, "row changed");
    });
  }
  FUZZ_CHECK(s.ok() == valid, n, " rows: ", s.ToString());
  if (!s.ok()) return CheckRefused(s);
  FUZZ_CHECK(calls == n, calls, " rows given back of ", n);
}

}  // namespace
}  // namespace pscluster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster;
  FuzzInput in(data, size);
  const bool table = in.Bool();
  v1::SavedShard saved;
  saved.set_name(in.Short());
  saved.set_file("ps-0");
  const uint8_t flags = in.Int<uint8_t>();
  if (table) {
    FuzzTable(in, saved, flags);
  } else {
    FuzzDense(in, saved, flags);
  }
  return 0;
}
