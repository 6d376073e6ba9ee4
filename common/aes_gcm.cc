#include "common/aes_gcm.h"

#include <intel-ipsec-mb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>

#include "glog/logging.h"

namespace pscluster {
namespace aes_gcm {
namespace {

// libipsec-mb's manager: only its function pointers are used (the GCM calls keep their state
// in the caller's key and context structures), so one, set up once, serves every thread.
struct IpsecMb {
  IMB_MGR* mgr = nullptr;
  IMB_ARCH arch = IMB_ARCH_NONE;
};

const IpsecMb& Ipsec() {
  static const IpsecMb* const ipsec = [] {
    auto* s = new IpsecMb;
    s->mgr = alloc_mb_mgr(0);
    if (s->mgr != nullptr) init_mb_mgr_auto(s->mgr, &s->arch);
    return s;
  }();
  return *ipsec;
}

bool IpsecUsable() {
  const IpsecMb& s = Ipsec();
  return s.mgr != nullptr && s.arch >= IMB_ARCH_SSE && (s.mgr->features & IMB_FEATURE_AESNI) != 0;
}

const EVP_CIPHER* OpenSslAes128Gcm() {
  static const EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-128-GCM", nullptr);
  return cipher;
}

// This thread's OpenSSL context, kept from chunk to chunk (a new key and nonce each time).
EVP_CIPHER_CTX* ThreadCipher() {
  struct Holder {
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    ~Holder() { EVP_CIPHER_CTX_free(ctx); }
  };
  thread_local Holder holder;
  return holder.ctx;
}

bool OpenSslSeal(const unsigned char* key, const unsigned char* nonce, const unsigned char* aad,
                 size_t aad_size, const Piece* pieces, int num_pieces, unsigned char* out,
                 unsigned char* tag) {
  EVP_CIPHER_CTX* ctx = ThreadCipher();
  int len = 0;
  if (EVP_EncryptInit_ex2(ctx, OpenSslAes128Gcm(), key, nonce, nullptr) != 1) return false;
  if (aad_size > 0 && EVP_EncryptUpdate(ctx, nullptr, &len, aad, static_cast<int>(aad_size)) != 1) {
    return false;
  }
  for (int i = 0; i < num_pieces; ++i) {
    if (EVP_EncryptUpdate(ctx, out, &len, static_cast<const unsigned char*>(pieces[i].data),
                          static_cast<int>(pieces[i].size)) != 1) {
      return false;
    }
    out += len;
  }
  if (EVP_EncryptFinal_ex(ctx, out, &len) != 1) return false;
  return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes), tag) == 1;
}

bool OpenSslOpen(const unsigned char* key, const unsigned char* nonce, const unsigned char* aad,
                 size_t aad_size, const unsigned char* in, size_t size, const unsigned char* tag,
                 unsigned char* out) {
  EVP_CIPHER_CTX* ctx = ThreadCipher();
  int len = 0;
  if (EVP_DecryptInit_ex2(ctx, OpenSslAes128Gcm(), key, nonce, nullptr) != 1) return false;
  if (aad_size > 0 && EVP_DecryptUpdate(ctx, nullptr, &len, aad, static_cast<int>(aad_size)) != 1) {
    return false;
  }
  if (EVP_DecryptUpdate(ctx, out, &len, in, static_cast<int>(size)) != 1) return false;
  unsigned char expected[kTagBytes];
  std::memcpy(expected, tag, kTagBytes);
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagBytes), expected) != 1) {
    return false;
  }
  return EVP_DecryptFinal_ex(ctx, out + len, &len) == 1;
}

bool IpsecSeal(const unsigned char* key, const unsigned char* nonce, const unsigned char* aad,
               size_t aad_size, const Piece* pieces, int num_pieces, unsigned char* out,
               unsigned char* tag) {
  IMB_MGR* mgr = Ipsec().mgr;
  alignas(64) gcm_key_data key_data;
  alignas(64) gcm_context_data context;
  IMB_AES128_GCM_PRE(mgr, key, &key_data);
  if (num_pieces == 1) {
    IMB_AES128_GCM_ENC(mgr, &key_data, &context, out, static_cast<const uint8_t*>(pieces[0].data),
                       pieces[0].size, nonce, aad, aad_size, tag, kTagBytes);
  } else {
    IMB_AES128_GCM_INIT(mgr, &key_data, &context, nonce, aad, aad_size);
    for (int i = 0; i < num_pieces; ++i) {
      IMB_AES128_GCM_ENC_UPDATE(mgr, &key_data, &context, out,
                                static_cast<const uint8_t*>(pieces[i].data), pieces[i].size);
      out += pieces[i].size;
    }
    IMB_AES128_GCM_ENC_FINALIZE(mgr, &key_data, &context, tag, kTagBytes);
  }
  // (No imb_get_errno: the manager is shared by every thread, so its error field is not this
  // call's; the library reports only invalid arguments there, and these are valid.)
  return true;
}

bool IpsecOpen(const unsigned char* key, const unsigned char* nonce, const unsigned char* aad,
               size_t aad_size, const unsigned char* in, size_t size, const unsigned char* tag,
               unsigned char* out) {
  IMB_MGR* mgr = Ipsec().mgr;
  alignas(64) gcm_key_data key_data;
  alignas(64) gcm_context_data context;
  unsigned char computed[kTagBytes];
  IMB_AES128_GCM_PRE(mgr, key, &key_data);
  IMB_AES128_GCM_DEC(mgr, &key_data, &context, out, in, size, nonce, aad, aad_size, computed,
                     kTagBytes);
  return CRYPTO_memcmp(computed, tag, kTagBytes) == 0;
}

}  // namespace

bool Available(Engine engine) {
  return engine == Engine::kOpenSsl ? OpenSslAes128Gcm() != nullptr : IpsecUsable();
}

Engine DefaultEngine() {
  static const Engine engine = [] {
    const char* env = std::getenv("PSCLUSTER_SEAL_CIPHER");
    if (env != nullptr && std::strcmp(env, "openssl") == 0) return Engine::kOpenSsl;
    if (env != nullptr && *env != '\0' && std::strcmp(env, "ipsec-mb") != 0) {
      LOG(WARNING) << "PSCLUSTER_SEAL_CIPHER=" << env
                   << " is not a cipher engine (expected openssl or ipsec-mb); choosing by CPU";
    }
    return IpsecUsable() ? Engine::kIpsecMb : Engine::kOpenSsl;
  }();
  return engine;
}

absl::string_view EngineName(Engine engine) {
  if (engine == Engine::kOpenSsl) return "openssl";
  switch (Ipsec().arch) {
    case IMB_ARCH_AVX512:
      return "ipsec-mb (avx512)";
    case IMB_ARCH_AVX2:
      return "ipsec-mb (avx2)";
    case IMB_ARCH_AVX:
      return "ipsec-mb (avx)";
    case IMB_ARCH_SSE:
      return "ipsec-mb (sse)";
    default:
      return "ipsec-mb (unusable here)";
  }
}

bool Seal(Engine engine, const unsigned char key[kKeyBytes], const unsigned char nonce[kNonceBytes],
          const unsigned char* aad, size_t aad_size, const Piece* pieces, int num_pieces,
          unsigned char* out, unsigned char tag[kTagBytes]) {
  if (engine == Engine::kIpsecMb && IpsecUsable()) {
    return IpsecSeal(key, nonce, aad, aad_size, pieces, num_pieces, out, tag);
  }
  return OpenSslSeal(key, nonce, aad, aad_size, pieces, num_pieces, out, tag);
}

bool Open(Engine engine, const unsigned char key[kKeyBytes], const unsigned char nonce[kNonceBytes],
          const unsigned char* aad, size_t aad_size, const unsigned char* in, size_t size,
          const unsigned char tag[kTagBytes], unsigned char* out) {
  if (engine == Engine::kIpsecMb && IpsecUsable()) {
    return IpsecOpen(key, nonce, aad, aad_size, in, size, tag, out);
  }
  return OpenSslOpen(key, nonce, aad, aad_size, in, size, tag, out);
}

}  // namespace aes_gcm
}  // namespace pscluster
