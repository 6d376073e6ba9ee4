#ifndef PSCLUSTER_COMMON_AES_GCM_H_
#define PSCLUSTER_COMMON_AES_GCM_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace pscluster {
namespace aes_gcm {

// AES-128-GCM (NIST SP 800-38D) with a 12-byte nonce and a 16-byte tag: the cipher of the
// tensor data plane's sealed chunks (common/sealed_channel.h). Two engines compute the same
// function, so the two ends of a connection need not agree on one:
//
//   kIpsecMb  Intel's multi-buffer crypto library (Debian's libipsec-mb1), which picks the
//             widest code the CPU runs: with AVX-512 VAES it seals 18.6 GB/s on one core of
//             the 2-core development VM where OpenSSL 3.0 seals 4.7 (Debian 12's OpenSSL has
//             no VAES code for GCM). Used where the CPU has AES-NI.
//   kOpenSsl  OpenSSL's EVP interface: CPUs without AES-NI, and PSCLUSTER_SEAL_CIPHER=openssl
//             (A/B measurements).
enum class Engine { kIpsecMb, kOpenSsl };

// The engine this process seals and opens with, chosen once: PSCLUSTER_SEAL_CIPHER
// ("openssl" or "ipsec-mb"), else libipsec-mb where the CPU has AES-NI, else OpenSSL.
Engine DefaultEngine();
// Whether `engine` runs on this CPU (OpenSSL always does).
bool Available(Engine engine);
// "ipsec-mb (avx512)", "openssl": for logs and benchmark output.
absl::string_view EngineName(Engine engine);

constexpr size_t kKeyBytes = 16;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;

// A piece of plaintext; a chunk is sealed from several without gathering them first.
struct Piece {
  const void* data;
  size_t size;
};

// Encrypts the concatenation of `pieces` into `out` (room for their total size) and writes
// the tag, authenticating `aad` too. False only when the library fails (it does not for valid
// arguments).
bool Seal(Engine engine, const unsigned char key[kKeyBytes], const unsigned char nonce[kNonceBytes],
          const unsigned char* aad, size_t aad_size, const Piece* pieces, int num_pieces,
          unsigned char* out, unsigned char tag[kTagBytes]);

// Decrypts `size` bytes of `in` into `out` and checks `tag` (in constant time). False when
// the bytes, the aad, the nonce or the tag were changed: `out` then holds no usable bytes.
bool Open(Engine engine, const unsigned char key[kKeyBytes], const unsigned char nonce[kNonceBytes],
          const unsigned char* aad, size_t aad_size, const unsigned char* in, size_t size,
          const unsigned char tag[kTagBytes], unsigned char* out);

}  // namespace aes_gcm
}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_AES_GCM_H_
