#ifndef PSCLUSTER_PS_SERVER_EMBEDDING_TABLE_INTERNAL_H_
#define PSCLUSTER_PS_SERVER_EMBEDDING_TABLE_INTERNAL_H_

// What the files of EmbeddingTable share (embedding_table.cc: pulls and pushes;
// embedding_table_spec.cc: a table made from its spec; embedding_table_rows.cc: the whole table
// read and written, for checkpoints and psctl). Not for other users.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/ps_service.pb.h"
#include "ps_server/row_index.h"

namespace pscluster {
namespace embedding_table_internal {

inline absl::Status WithTablePrefix(const std::string& table, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("table ", table, ": ", status.message()));
}

// A hashed table's row: its floats, its index entry and (with eviction) its last use.
inline int64_t RowBytes(int64_t stride, bool tracks_last) {
  return stride * static_cast<int64_t>(sizeof(float)) +
         static_cast<int64_t>(sizeof(RowIndex::Entry)) + (tracks_last ? 4 : 0);
}

// A vocabulary table's row: its floats and its count.
inline int64_t VocabularyRowBytes(int64_t stride) {
  return stride * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(uint32_t));
}

// Whether rows keep their last use (any TTL or capacity).
inline bool TracksLast(const v1::EvictionSpec& e) {
  return e.ttl_steps() > 0 || e.ttl_seconds() > 0 || e.max_rows() > 0 || e.max_bytes() > 0;
}

}  // namespace embedding_table_internal
}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_EMBEDDING_TABLE_INTERNAL_H_
