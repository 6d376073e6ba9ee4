#include "common/aes_gcm.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace aes_gcm {
namespace {

using Bytes = std::vector<unsigned char>;

Bytes FromHex(absl::string_view hex) {
  const std::string raw = absl::HexStringToBytes(hex);
  return Bytes(raw.begin(), raw.end());
}

std::vector<Engine> AvailableEngines() {
  std::vector<Engine> engines = {Engine::kOpenSsl};
  if (Available(Engine::kIpsecMb)) engines.push_back(Engine::kIpsecMb);
  return engines;
}

Bytes Random(size_t n, std::mt19937& rng) {
  Bytes b(n);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

// Seals `plain` cut into pieces of the given sizes (the last takes the rest); ciphertext + tag.
Bytes SealInPieces(Engine engine, const Bytes& key, const Bytes& nonce, const Bytes& aad,
                   const Bytes& plain, const std::vector<size_t>& cuts) {
  std::vector<Piece> pieces;
  size_t at = 0;
  for (size_t cut : cuts) {
    if (at + cut > plain.size()) break;
    pieces.push_back({plain.data() + at, cut});
    at += cut;
  }
  pieces.push_back({plain.data() + at, plain.size() - at});
  Bytes out(plain.size() + kTagBytes);
  EXPECT_TRUE(Seal(engine, key.data(), nonce.data(), aad.data(), aad.size(), pieces.data(),
                   static_cast<int>(pieces.size()), out.data(), out.data() + plain.size()));
  return out;
}

// The published AES-128 test case with additional data and a 60-byte message (McGrew and
// Viega's GCM specification, test case 4), through each engine.
TEST(AesGcmTest, EveryEngineGivesThePublishedCiphertextAndTag) {
  const Bytes key = FromHex("feffe9928665731c6d6a8f9467308308");
  const Bytes nonce = FromHex("cafebabefacedbaddecaf888");
  const Bytes aad = FromHex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  const Bytes plain = FromHex(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
      "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39");
  const Bytes expected = FromHex(
      "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
      "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091"
      "5bc94fbc3221a5db94fae95ae7121a47");
  for (Engine engine : AvailableEngines()) {
    SCOPED_TRACE(std::string(EngineName(engine)));
    EXPECT_EQ(SealInPieces(engine, key, nonce, aad, plain, {}), expected);
    EXPECT_EQ(SealInPieces(engine, key, nonce, aad, plain, {1, 15, 17}), expected);
    Bytes opened(plain.size());
    ASSERT_TRUE(Open(engine, key.data(), nonce.data(), aad.data(), aad.size(), expected.data(),
                     plain.size(), expected.data() + plain.size(), opened.data()));
    EXPECT_EQ(opened, plain);
  }
}

// What one engine seals the other opens, in any cut of the plaintext into pieces: the two
// ends of a connection may run different engines (a CPU without AES-NI, PSCLUSTER_SEAL_CIPHER).
TEST(AesGcmTest, TheEnginesAgreeOnLargeChunksCutAnyWay) {
  if (!Available(Engine::kIpsecMb)) GTEST_SKIP() << "no AES-NI here: only OpenSSL runs";
  std::mt19937 rng(7);
  const std::vector<std::vector<size_t>> cuts = {
      {}, {4}, {1, 2, 3, 4, 5}, {16, 16, 16}, {4099, 65536}, {131071}, {33, 65536, 7}};
  for (size_t size : {size_t{1}, size_t{15}, size_t{16}, size_t{4100}, size_t{131072}}) {
    const Bytes key = Random(kKeyBytes, rng);
    const Bytes nonce = Random(kNonceBytes, rng);
    const Bytes aad = Random(4, rng);
    const Bytes plain = Random(size, rng);
    const Bytes reference = SealInPieces(Engine::kOpenSsl, key, nonce, aad, plain, {});
    for (const auto& cut : cuts) {
      SCOPED_TRACE(testing::Message() << size << " bytes, cut " << cut.size() << " ways");
      EXPECT_EQ(SealInPieces(Engine::kIpsecMb, key, nonce, aad, plain, cut), reference);
    }
    for (Engine opener : {Engine::kOpenSsl, Engine::kIpsecMb}) {
      Bytes opened(size, 0xAA);
      EXPECT_TRUE(Open(opener, key.data(), nonce.data(), aad.data(), aad.size(), reference.data(),
                       size, reference.data() + size, opened.data()));
      EXPECT_EQ(opened, plain);
    }
  }
}

// A changed byte of the ciphertext, the tag, the additional data or the nonce is refused by
// every engine.
TEST(AesGcmTest, AnythingChangedIsRefused) {
  std::mt19937 rng(11);
  const Bytes key = Random(kKeyBytes, rng);
  const Bytes nonce = Random(kNonceBytes, rng);
  const Bytes aad = Random(4, rng);
  const Bytes plain = Random(5000, rng);
  for (Engine engine : AvailableEngines()) {
    SCOPED_TRACE(std::string(EngineName(engine)));
    const Bytes sealed = SealInPieces(engine, key, nonce, aad, plain, {});
    const auto opens = [&](const Bytes& s, const Bytes& a, const Bytes& n) {
      Bytes out(plain.size());
      return Open(engine, key.data(), n.data(), a.data(), a.size(), s.data(), plain.size(),
                  s.data() + plain.size(), out.data());
    };
    EXPECT_TRUE(opens(sealed, aad, nonce));
    for (size_t at : {size_t{0}, size_t{4999}, size_t{5000}, size_t{5015}}) {
      Bytes changed = sealed;
      changed[at] ^= 0x01;
      EXPECT_FALSE(opens(changed, aad, nonce)) << "byte " << at << " changed";
    }
    Bytes other_aad = aad;
    other_aad[3] ^= 0x80;
    EXPECT_FALSE(opens(sealed, other_aad, nonce));
    Bytes other_nonce = nonce;
    other_nonce[11] ^= 0x01;
    EXPECT_FALSE(opens(sealed, aad, other_nonce));
  }
}

TEST(AesGcmTest, TheDefaultEngineRunsHereAndIsNamed) {
  EXPECT_TRUE(Available(DefaultEngine()));
  EXPECT_FALSE(EngineName(DefaultEngine()).empty());
  EXPECT_EQ(DefaultEngine() == Engine::kIpsecMb, Available(Engine::kIpsecMb));
}

}  // namespace
}  // namespace aes_gcm
}  // namespace pscluster
