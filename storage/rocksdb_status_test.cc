#include "storage/rocksdb_status.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

TEST(FromRocksDbTest, MapsCodesAndKeepsContext) {
  EXPECT_TRUE(FromRocksDb(rocksdb::Status::OK(), "x").ok());
  absl::Status s = FromRocksDb(rocksdb::Status::Corruption("bad block"), "reading shard ps-0");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("reading shard ps-0: Corruption: bad block"));
  EXPECT_EQ(FromRocksDb(rocksdb::Status::NotFound(), "k").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FromRocksDb(rocksdb::Status::IOError(), "k").code(), absl::StatusCode::kUnavailable);
}

TEST(FromRocksDbTest, OpeningAMissingDatabaseNamesIt) {
  rocksdb::Options options;
  options.create_if_missing = false;
  rocksdb::DB* db = nullptr;
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/no-such-db";
  absl::Status s = FromRocksDb(rocksdb::DB::OpenForReadOnly(options, path, &db), "opening " + path);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("opening " + path));
  delete db;
}

}  // namespace
}  // namespace pscluster
