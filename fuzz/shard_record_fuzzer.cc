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
//   table, flags bit 2: blocks of rows (SavedShard.row_block = 1 + a byte % 8), the record
//          count (byte % 9), then per record a byte: odd, a well-formed block built from the
//          input (rows 1 + byte / 2 % row_block, a stride byte % 4 for the part, keys from
//          positive steps, counts, floats), keyed by its first row, unless a second byte's bit 0
//          moves the key; even, a key suffix (as above) and raw value bytes.
// Invariants: a record is accepted exactly when its checksum and row count match and every
// value is an 8-byte update count and whole float32s, all of one length for a table, or, with
// blocks, every block holds 1 to row_block rows of one stride, keys increasing from block to
// block, each keyed by its first; an accepted record gives back exactly the stored bytes; a
// refused one is DATA_LOSS naming the file.
#include <zlib.h>

#include <algorithm>
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

std::string KeySuffix(int64_t key) {
  uint64_t u = static_cast<uint64_t>(key) ^ (uint64_t{1} << 63);
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, u >>= 8) out[i] = static_cast<char>(u & 0xff);
  return out;
}

int64_t SuffixKey(const std::string& key, size_t at) {
  uint64_t u = 0;
  for (int b = 0; b < 8; ++b) u = (u << 8) | static_cast<uint8_t>(key[at + b]);
  return static_cast<int64_t>(u ^ (uint64_t{1} << 63));
}

// Table parts written in blocks of rows (storage/checkpoint.h, kRowBlock).
void FuzzTableBlocks(FuzzInput& in, v1::SavedShard& saved, uint8_t flags) {
  saved.set_is_table(true);
  saved.set_partition(-1);
  saved.set_row_block(1 + in.Int<uint8_t>() % 8);
  const uint32_t checksum = (flags & 1) ? 0 : in.Int<uint32_t>();
  const int64_t saved_rows = (flags & 2) ? 0 : in.Int<int64_t>();
  const std::string prefix = TablePartDecoder::Prefix(saved);
  const int records_n = in.Small(0, 8);
  const int64_t part_stride = in.Int<uint8_t>() % 4;
  std::vector<std::pair<std::string, std::string>> records;
  int64_t next_key = in.Int<int32_t>();
  for (int r = 0; r < records_n; ++r) {
    const uint8_t shape = in.Int<uint8_t>();
    if (shape % 2 == 0) {
      const size_t suffix = shape % 16 == 0 ? shape / 16 % 16 : 8;
      std::string key = prefix + in.Bytes(suffix);
      records.emplace_back(std::move(key), in.Short());
      continue;
    }
    const int64_t n = 1 + shape / 2 % saved.row_block();
    std::string value(8 + 16 * n + 4 * n * part_stride, '\0');
    std::memcpy(value.data(), &n, 8);
    std::vector<int64_t> keys(n);
    for (int64_t j = 0; j < n; ++j) {
      keys[j] = next_key;
      next_key += 1 + in.Int<uint8_t>();
      const int64_t count = in.Int<int64_t>();
      std::memcpy(value.data() + 8 + 8 * j, &keys[j], 8);
      std::memcpy(value.data() + 8 + 8 * (n + j), &count, 8);
    }
    for (int64_t f = 0; f < n * part_stride; ++f) {
      const float x = static_cast<float>(in.Int<int16_t>());
      std::memcpy(value.data() + 8 + 16 * n + 4 * f, &x, 4);
    }
    const int64_t key = (in.Int<uint8_t>() & 1) ? keys[0] + 1 : keys[0];
    records.emplace_back(prefix + KeySuffix(key), std::move(value));
  }
  uint32_t crc = 0;
  for (const auto& [key, value] : records) crc = Crc(Crc(crc, key), value);

  // What a correct decoder does: the rows of every record, or the first fault.
  struct Row {
    int64_t key, count;
    std::string floats;
  };
  std::vector<Row> rows;
  bool blocks_ok = true;
  int64_t stride = -1;
  for (const auto& [key, value] : records) {
    int64_t n = 0;
    if (value.size() >= 8) std::memcpy(&n, value.data(), 8);
    const uint64_t heads = 8 + 16 * static_cast<uint64_t>(std::max<int64_t>(n, 0));
    if (key.size() != prefix.size() + 8 || value.size() < 8 || n < 1 || n > saved.row_block() ||
        value.size() < heads || (value.size() - heads) % (4 * static_cast<uint64_t>(n)) != 0) {
      blocks_ok = false;
      break;
    }
    const int64_t s = static_cast<int64_t>((value.size() - heads) / (4 * n));
    if (stride >= 0 && s != stride) {
      blocks_ok = false;
      break;
    }
    stride = s;
    for (int64_t j = 0; j < n && blocks_ok; ++j) {
      Row row;
      std::memcpy(&row.key, value.data() + 8 + 8 * j, 8);
      std::memcpy(&row.count, value.data() + 8 + 8 * (n + j), 8);
      row.floats = value.substr(heads + 4 * j * s, 4 * s);
      if ((j == 0 && row.key != SuffixKey(key, prefix.size())) ||
          (!rows.empty() && row.key <= rows.back().key)) {
        blocks_ok = false;
      }
      rows.push_back(std::move(row));
    }
    if (!blocks_ok) break;
  }
  saved.set_checksum((flags & 1) ? crc : checksum);
  saved.set_rows((flags & 2) ? static_cast<int64_t>(rows.size()) : saved_rows);
  const bool valid =
      blocks_ok && saved.checksum() == crc && saved.rows() == static_cast<int64_t>(rows.size());

  TablePartDecoder decoder(kPath, saved);
  absl::Status s;
  for (const auto& [key, value] : records) {
    s = decoder.Add(key, value);
    if (!s.ok()) break;
  }
  size_t calls = 0;
  if (s.ok()) {
    s = decoder.Finish([&](int64_t key, const float* row, int64_t t, int64_t row_stride) {
      FUZZ_CHECK(calls < rows.size(), "more rows than the blocks hold");
      const Row& want = rows[calls++];
      FUZZ_CHECK(key == want.key && t == want.count, "row ", calls, " changed");
      FUZZ_CHECK(row_stride * 4 == static_cast<int64_t>(want.floats.size()), "stride");
      FUZZ_CHECK(row_stride == 0 || std::memcmp(row, want.floats.data(), 4 * row_stride) == 0,
                 "row ", calls, "'s floats changed");
    });
  }
  FUZZ_CHECK(s.ok() == valid, records.size(), " blocks: ", s.ToString());
  if (!s.ok()) return CheckRefused(s);
  FUZZ_CHECK(calls == rows.size(), calls, " rows given back of ", rows.size());
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
  if (table && (flags & 4)) {
    FuzzTableBlocks(in, saved, flags);
  } else if (table) {
    FuzzTable(in, saved, flags);
  } else {
    FuzzDense(in, saved, flags);
  }
  return 0;
}
