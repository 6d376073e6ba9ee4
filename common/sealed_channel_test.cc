#include "common/sealed_channel.h"

#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/socket_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/tls_pair.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr int kHeader = SealedChannel::kHeaderBytes;
constexpr int kTag = SealedChannel::kTagBytes;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// The chunks a buffer of n bytes is cut into (PSCLUSTER_SEAL_CHUNK_BYTES sets their size: the
// tests run with the default and with the largest).
size_t ChunksOf(size_t n) {
  const size_t c = SealedChannel::WriteChunkBytes();
  return (n + c - 1) / c;
}

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

iovec Iov(const std::string& s) { return iovec{const_cast<char*>(s.data()), s.size()}; }

// A client channel writing into one pair and a server channel reading from another: the test
// carries (and may change) the sealed bytes between them.
class SealedChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tls_.ok());
    Open(20);
  }
  void Open(int epoch_log2) {
    auto writer = SealedChannel::Create(out_.fd[0], tls_.client(), epoch_log2);
    auto reader = SealedChannel::Create(in_.fd[1], tls_.server(), epoch_log2);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(reader.ok()) << reader.status();
    writer_ = *std::move(writer);
    reader_ = *std::move(reader);
  }
  // Writes on a thread (a large write fills the socket before the test takes it) and returns
  // the sealed bytes that came out.
  std::string Sealed(std::vector<iovec> iov) { return Sealed(writer_.get(), out_, {iov}); }
  // As above, for several writes one after the other.
  std::string SealedWrites(std::vector<std::vector<iovec>> writes) {
    return Sealed(writer_.get(), out_, std::move(writes));
  }
  static std::string Sealed(SealedChannel* writer, SocketPair& out,
                            std::vector<std::vector<iovec>> writes) {
    absl::Status written;
    std::string sealed = CaptureWrites(
        out,
        [&] {
          absl::Status s;
          for (std::vector<iovec>& iov : writes) {
            if (s.ok()) s = writer->Write(iov.data(), static_cast<int>(iov.size()), Soon());
          }
          return s;
        },
        &written);
    EXPECT_TRUE(written.ok()) << written;
    return sealed;
  }
  // Hands `sealed` to the reader's socket from a thread, then (with `close`) ends the
  // stream. A reader that refuses it stops reading: then sending may fail.
  std::thread Deliver(std::string sealed, bool must_arrive = true, bool close = false) {
    return std::thread([this, must_arrive, close, sealed = std::move(sealed)] {
      iovec iov = Iov(sealed);
      absl::Status sent = SendAll(in_.fd[0], &iov, 1, Soon());
      if (must_arrive) {
        EXPECT_TRUE(sent.ok()) << sent;
      }
      if (close) shutdown(in_.fd[0], SHUT_WR);
    });
  }
  // The chunk lengths in a sealed stream.
  static std::vector<uint32_t> ChunkSizes(const std::string& sealed) {
    std::vector<uint32_t> sizes;
    for (size_t at = 0; at + kHeader <= sealed.size();) {
      const uint32_t n = absl::little_endian::Load32(sealed.data() + at);
      sizes.push_back(n);
      at += kHeader + n + kTag;
    }
    return sizes;
  }

  TlsPair tls_;
  SocketPair out_;
  SocketPair in_;
  std::unique_ptr<SealedChannel> writer_;
  std::unique_ptr<SealedChannel> reader_;
};

TEST_F(SealedChannelTest, FramesComeBackWholeInAnySplit) {
  // A frame as the data plane writes one: header and meta gathered, a 1 MiB + 5 payload cut
  // into chunks of its own, then a small one again.
  const std::string header = Bytes(32, 1), meta = Bytes(300, 2);
  const std::string payload = Bytes((1 << 20) + 5, 3), tail = Bytes(7, 4);
  const SealedChannel::WorkSplit before = SealedChannel::Split();
  const std::string sealed = Sealed({Iov(header), Iov(meta), Iov(payload), Iov(tail)});
  const std::vector<uint32_t> sizes = ChunkSizes(sealed);
  // (the small tail joins the payload's last, small chunk)
  const size_t c = SealedChannel::WriteChunkBytes();
  const size_t full = payload.size() / c, chunks = 1 + full + 1;
  ASSERT_GT(payload.size() % c, 0u);
  ASSERT_EQ(sizes.size(), chunks);
  EXPECT_EQ(sizes[0], 332u);
  for (size_t i = 1; i <= full; ++i) EXPECT_EQ(sizes[i], c) << i;
  EXPECT_EQ(sizes.back(), payload.size() % c + 7u);
  EXPECT_EQ(sealed.size(), 32 + 300 + payload.size() + 7 + chunks * (kHeader + kTag));
  EXPECT_EQ(sealed.find(payload.substr(1000, 64)), std::string::npos) << "sent in the clear";

  // Read back in pieces that cut across chunks: 32, 10, the rest of the meta and 100 KiB of
  // the payload, all the rest.
  std::thread deliver = Deliver(sealed);
  const std::string all = header + meta + payload + tail;
  std::string got(all.size(), '\0');
  size_t at = 0;
  for (size_t n : {size_t{32}, size_t{10}, size_t{290 + (100 << 10)}}) {
    ASSERT_TRUE(reader_->Read(&got[at], static_cast<int64_t>(n), Soon()).ok());
    at += n;
  }
  EXPECT_TRUE(reader_->HasBuffered());
  ASSERT_TRUE(reader_->Read(&got[at], static_cast<int64_t>(all.size() - at), Soon()).ok());
  deliver.join();
  EXPECT_FALSE(reader_->HasBuffered());
  EXPECT_TRUE(got == all) << "the bytes differ";

  // Every chunk was sealed once and opened once, by the calling threads alone where there are
  // no helpers.
  const SealedChannel::WorkSplit after = SealedChannel::Split();
  const int64_t sealed_here = after.sealed_by_caller - before.sealed_by_caller;
  const int64_t sealed_by_pool = after.sealed_by_pool - before.sealed_by_pool;
  const int64_t opened_here = after.opened_by_caller - before.opened_by_caller;
  const int64_t opened_by_pool = after.opened_by_pool - before.opened_by_pool;
  EXPECT_EQ(sealed_here + sealed_by_pool, static_cast<int64_t>(chunks));
  EXPECT_EQ(opened_here + opened_by_pool, static_cast<int64_t>(chunks));
  if (SealedChannel::ParallelThreads() == 0) {
    EXPECT_EQ(sealed_by_pool, 0);
    EXPECT_EQ(opened_by_pool, 0);
  }
}

TEST_F(SealedChannelTest, HelpersStayOutWhileManyCallsAreUnderWay) {
  const int helpers = SealedChannel::ParallelThreads();
  if (helpers == 0) GTEST_SKIP() << "no helper threads in this variant";
  if (const char* always = std::getenv("PSCLUSTER_SEAL_HELP_ALWAYS");
      always != nullptr && std::strcmp(always, "1") == 0) {
    GTEST_SKIP() << "PSCLUSTER_SEAL_HELP_ALWAYS=1: helpers for every call";
  }
  // One more read under way than there are helpers (waiting for bytes that do not come), as
  // the other stripes of a pull are: a large write and a large read besides them seal and open
  // every chunk on their own threads.
  ASSERT_EQ(SealedChannel::CallsUnderWay(), 0);
  std::vector<std::unique_ptr<SocketPair>> idle;
  std::vector<std::unique_ptr<SealedChannel>> idle_readers;
  for (int i = 0; i <= helpers; ++i) {
    idle.push_back(std::make_unique<SocketPair>());
    auto reader = SealedChannel::Create(idle.back()->fd[1], tls_.server());
    ASSERT_TRUE(reader.ok()) << reader.status();
    idle_readers.push_back(*std::move(reader));
  }
  // The waiting reads end (the peers close without a byte) however the test ends.
  struct Waiting {
    std::vector<std::unique_ptr<SocketPair>>* idle;
    std::vector<std::thread> threads;
    ~Waiting() {
      for (auto& pair : *idle) shutdown(pair->fd[0], SHUT_WR);
      for (std::thread& t : threads) t.join();
    }
  } waiting{&idle, {}};
  for (const std::unique_ptr<SealedChannel>& r : idle_readers) {
    waiting.threads.emplace_back([r = r.get()] {
      char byte;
      EXPECT_FALSE(r->Read(&byte, 1, Soon()).ok());
    });
  }
  const absl::Time give_up = Soon();
  while (SealedChannel::CallsUnderWay() <= helpers && absl::Now() < give_up) {
    std::this_thread::yield();
  }
  ASSERT_EQ(SealedChannel::CallsUnderWay(), helpers + 1);
  const std::string payload = Bytes(1 << 20, 5);
  const int64_t chunks = static_cast<int64_t>(payload.size() / SealedChannel::WriteChunkBytes());
  SealedChannel::WorkSplit before = SealedChannel::Split();
  const std::string sealed = Sealed({Iov(payload)});
  SealedChannel::WorkSplit after = SealedChannel::Split();
  EXPECT_GE(after.sealed_by_caller - before.sealed_by_caller, chunks);
  EXPECT_EQ(after.sealed_by_pool - before.sealed_by_pool, 0);
  before = after;
  std::thread deliver = Deliver(sealed);
  std::string got(payload.size(), '\0');
  const absl::Status read = reader_->Read(&got[0], static_cast<int64_t>(got.size()), Soon());
  deliver.join();
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_TRUE(got == payload) << "the bytes differ";
  after = SealedChannel::Split();
  EXPECT_GE(after.opened_by_caller - before.opened_by_caller, chunks);
  EXPECT_EQ(after.opened_by_pool - before.opened_by_pool, 0);
}

TEST_F(SealedChannelTest, BothDirectionsAndNewKeysEveryEpoch) {
  Open(2);  // new keys every 4 chunks
  std::vector<std::string> messages;
  for (int i = 0; i < 10; ++i) messages.push_back(Bytes(100000 + i, 10 + i));
  std::vector<iovec> iov;
  for (const std::string& m : messages) iov.push_back(Iov(m));
  const std::string sealed = Sealed(iov);
  ASSERT_EQ(ChunkSizes(sealed).size(), 10 * ChunksOf(100000));
  std::thread deliver = Deliver(sealed);
  for (const std::string& m : messages) {
    std::string got(m.size(), '\0');
    ASSERT_TRUE(reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon()).ok());
    EXPECT_TRUE(got == m);
  }
  deliver.join();
  // The server's writes: another key (each side sends with its own).
  SocketPair back;
  auto server_writer = SealedChannel::Create(back.fd[0], tls_.server(), 2);
  ASSERT_TRUE(server_writer.ok());
  const std::string reply = Bytes(5000, 99);
  const std::string sealed_reply = Sealed(server_writer->get(), back, {{Iov(reply)}});
  // Read as if it came from the client: it does not authenticate.
  std::thread wrong = Deliver(sealed_reply, /*must_arrive=*/false);
  std::string got(reply.size(), '\0');
  absl::Status s = reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon());
  wrong.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(SealedChannelTest, ManySmallChunksTrickledInReadInOneCall) {
  // 40 writes of 1 to 40 bytes (a chunk each: more than one read's batch of chunks), then a
  // large message; the reader takes the 40 in one read and must leave the large message's
  // bytes in the socket for the next read, while the bytes come a few at a time.
  std::vector<std::string> small;
  std::string all_small;
  for (int i = 1; i <= 40; ++i) {
    small.push_back(Bytes(static_cast<size_t>(i), 200 + i));
    all_small += small.back();
  }
  const std::string large = Bytes(300000, 7);
  std::vector<std::vector<iovec>> writes;
  for (const std::string& m : small) writes.push_back({Iov(m)});
  writes.push_back({Iov(large)});
  const std::string sealed = SealedWrites(writes);
  ASSERT_EQ(ChunkSizes(sealed).size(), 40 + ChunksOf(large.size()));
  std::thread trickle([&] {
    std::mt19937 rng(5);
    for (size_t at = 0; at < sealed.size();) {
      const size_t n =
          std::min<size_t>(sealed.size() - at, 1 + rng() % 7 + (rng() % 8 == 0) * 5000);
      iovec iov{const_cast<char*>(sealed.data() + at), n};
      ASSERT_TRUE(SendAll(in_.fd[0], &iov, 1, Soon()).ok());
      at += n;
      if (rng() % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::string got(all_small.size(), '\0');
  ASSERT_TRUE(reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon()).ok());
  EXPECT_TRUE(got == all_small) << "the small chunks differ";
  EXPECT_FALSE(reader_->HasBuffered());
  std::string got_large(large.size(), '\0');
  ASSERT_TRUE(reader_->Read(got_large.data(), static_cast<int64_t>(large.size()), Soon()).ok());
  trickle.join();
  EXPECT_TRUE(got_large == large) << "the large message differs";
}

TEST_F(SealedChannelTest, StagedBytesGoOutOnFlushAndBeforeTheNextWrite) {
  std::string first = Bytes(300000, 31), second = Bytes(40, 32);
  const std::string third = Bytes(70000, 33), fourth = Bytes(5000, 34);
  const std::string want = first + second + third + fourth;
  absl::Status status;
  size_t staged_after_two = 0, staged_after_flush = 1;
  const std::string sealed = CaptureWrites(
      out_,
      [&] {
        std::vector<iovec> a = {Iov(first)}, b = {Iov(second)}, c = {Iov(third)}, d = {Iov(fourth)};
        absl::Status status = writer_->Stage(a.data(), 1);
        if (status.ok()) status = writer_->Stage(b.data(), 1);
        staged_after_two = writer_->staged_bytes();
        // The caller's buffers change once staged (a shard once its lock is let go): what goes
        // out is what was staged.
        first.assign(first.size(), 'x');
        second.assign(second.size(), 'y');
        if (status.ok()) status = writer_->Flush(Soon());
        staged_after_flush = writer_->staged_bytes();
        // Staged again, then a Write: the staged bytes go first.
        if (status.ok()) status = writer_->Stage(c.data(), 1);
        if (status.ok()) status = writer_->Write(d.data(), 1, Soon());
        return status;
      },
      &status);
  ASSERT_TRUE(status.ok()) << status;
  // The first's chunks, then 1, of which the socket took some at once (a reader drains it).
  EXPECT_LE(staged_after_two, 300000u + 40u + (ChunksOf(300000) + 1) * (kHeader + kTag));
  EXPECT_EQ(staged_after_flush, 0u);
  std::thread deliver = Deliver(sealed);
  std::string got(want.size(), '\0');
  ASSERT_TRUE(reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon()).ok());
  deliver.join();
  EXPECT_TRUE(got == want) << "the bytes differ";
}

// Stage never waits on the socket (a ps stages under a shard's lock): with nobody reading, it
// sends what the socket's buffer takes and keeps the rest, which Flush sends once read.
TEST_F(SealedChannelTest, StageNeverWaitsOnAFullSocketAndKeepsTheRest) {
  const std::string big = Bytes(16 << 20, 35), small = Bytes(100, 36);
  std::vector<iovec> a = {Iov(big)}, b = {Iov(small)};
  const absl::Time started = absl::Now();
  ASSERT_TRUE(writer_->Stage(a.data(), 1).ok());
  ASSERT_TRUE(writer_->Stage(b.data(), 1).ok());
  EXPECT_LT(absl::Now() - started, absl::Seconds(10));  // it did not wait for a reader
  const size_t sealed_total =
      big.size() + small.size() + (ChunksOf(big.size()) + 1) * (kHeader + kTag);
  const size_t kept = writer_->staged_bytes();
  EXPECT_GT(kept, 0u);            // the socket's buffer is far smaller than 16 MiB
  EXPECT_LT(kept, sealed_total);  // and it took some
  // Read now: what the socket took, then what Flush sends, open back into the two messages.
  absl::Status status;
  const std::string sealed = CaptureWrites(
      out_, [&] { return writer_->Flush(Soon()); }, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(writer_->staged_bytes(), 0u);
  ASSERT_EQ(sealed.size(), sealed_total);
  std::thread deliver = Deliver(sealed);
  std::string got(big.size() + small.size(), '\0');
  ASSERT_TRUE(reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon()).ok());
  deliver.join();
  EXPECT_TRUE(got == big + small) << "the bytes differ";
}

class SealedChannelTamperTest : public SealedChannelTest {
 protected:
  // Three buffers of a chunk each (of the chunk size, at most 64 KiB: larger buffers start
  // chunks of their own), sealed.
  void SetUp() override {
    SealedChannelTest::SetUp();
    part_ = std::min<size_t>(SealedChannel::WriteChunkBytes(), 64 << 10);
    ASSERT_GT(part_, 12345u);
    for (int i = 0; i < 3; ++i) parts_.push_back(Bytes(part_, 50 + i));
    sealed_ = Sealed({Iov(parts_[0]), Iov(parts_[1]), Iov(parts_[2])});
    ASSERT_EQ(ChunkSizes(sealed_).size(), 3u);
    chunk_ = kHeader + part_ + kTag;
  }
  size_t part_ = 0;
  // Reads all three parts from `edited`; the reader must refuse with `code` and a message
  // containing `why`, then refuse every later call.
  void ExpectRefused(const std::string& edited, absl::StatusCode code, const std::string& why) {
    std::thread deliver = Deliver(edited, /*must_arrive=*/false, /*close=*/true);
    std::string got(3 * part_, '\0');
    absl::Status s = reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon());
    shutdown(in_.fd[1], SHUT_RDWR);  // the sender stops waiting for a reader that gave up
    deliver.join();
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(why));
    char one;
    EXPECT_EQ(reader_->Read(&one, 1, Soon()).code(), code) << "a broken channel reads on";
  }
  std::vector<std::string> parts_;
  std::string sealed_;
  size_t chunk_ = 0;
};

TEST_F(SealedChannelTamperTest, UntouchedReadsBack) {
  std::thread deliver = Deliver(sealed_);
  std::string got(3 * part_, '\0');
  ASSERT_TRUE(reader_->Read(got.data(), static_cast<int64_t>(got.size()), Soon()).ok());
  deliver.join();
  EXPECT_TRUE(got == parts_[0] + parts_[1] + parts_[2]);
}

TEST_F(SealedChannelTamperTest, AFlippedBitIsRefused) {
  std::string edited = sealed_;
  edited[chunk_ + kHeader + 12345] ^= 0x10;
  ExpectRefused(edited, absl::StatusCode::kDataLoss, "did not authenticate");
}

TEST_F(SealedChannelTamperTest, AFlippedTagIsRefused) {
  std::string edited = sealed_;
  edited[2 * chunk_ + kHeader + part_ + 3] ^= 1;
  ExpectRefused(edited, absl::StatusCode::kDataLoss, "did not authenticate");
}

TEST_F(SealedChannelTamperTest, ReorderedChunksAreRefused) {
  const std::string edited =
      sealed_.substr(chunk_, chunk_) + sealed_.substr(0, chunk_) + sealed_.substr(2 * chunk_);
  ExpectRefused(edited, absl::StatusCode::kDataLoss, "did not authenticate");
}

TEST_F(SealedChannelTamperTest, AReplayedChunkIsRefused) {
  const std::string edited = sealed_.substr(0, 2 * chunk_) + sealed_.substr(chunk_, chunk_);
  ExpectRefused(edited, absl::StatusCode::kDataLoss, "did not authenticate");
}

TEST_F(SealedChannelTamperTest, AnOversizedLengthIsRefusedBeforeReading) {
  std::string edited = sealed_;
  absl::little_endian::Store32(&edited[chunk_], 1u << 30);
  ExpectRefused(edited, absl::StatusCode::kDataLoss, "claims 1073741824 bytes; expected 1 to");
}

TEST_F(SealedChannelTamperTest, AChangedLengthIsRefused) {
  // A shorter length that still fits: the length is authenticated too. (A reader that opens
  // each chunk at once finds that; one that receives a batch first may read a length out of
  // the rest of the chunk before, and refuse that.)
  std::string edited = sealed_;
  absl::little_endian::Store32(&edited[0], part_ - kTag);
  ExpectRefused(edited, absl::StatusCode::kDataLoss, "data-plane chunk");
}

TEST_F(SealedChannelTamperTest, ATruncatedStreamIsUnavailable) {
  ExpectRefused(sealed_.substr(0, chunk_ + 100), absl::StatusCode::kUnavailable,
                "the peer closed the connection");
}

TEST(SealedChannelChunkBytesTest, ABadChunkSizeIsNamedWithItsRange) {
  EXPECT_EQ(*SealedChannel::ParseChunkBytes(nullptr), SealedChannel::kDefaultChunkBytes);
  EXPECT_EQ(*SealedChannel::ParseChunkBytes(""), SealedChannel::kDefaultChunkBytes);
  EXPECT_EQ(*SealedChannel::ParseChunkBytes("65536"), 65536u);
  EXPECT_EQ(*SealedChannel::ParseChunkBytes("4096"), 4096u);
  EXPECT_EQ(*SealedChannel::ParseChunkBytes("131072"), 131072u);
  for (const char* bad : {"4095", "131073", "-1", "48k", "lots"}) {
    const absl::StatusOr<size_t> parsed = SealedChannel::ParseChunkBytes(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(absl::StrCat("\"", bad, "\"")));
    EXPECT_THAT(parsed.status().message(), HasSubstr("from 4096 to 131072"));
  }
}

TEST(SealedChannelCreateTest, RefusesABadEpochSize) {
  TlsPair tls;
  ASSERT_TRUE(tls.ok());
  SocketPair pair;
  auto channel = SealedChannel::Create(pair.fd[0], tls.client(), 21);
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(channel.status().message()), HasSubstr("expected 0 to 20"));
}

}  // namespace
}  // namespace pscluster
