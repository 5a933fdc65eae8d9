#include "gpu/hash_desc.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_generateSecret_fromSeed
#include <xxhash.h>

namespace tutti::gpu {

const Xxh3Secret& DefaultXxh3Secret() {
  static const Xxh3Secret secret = [] {
    Xxh3Secret s;
    XXH3_generateSecret_fromSeed(s.bytes, 0);  // equals XXH3_kSecret
    return s;
  }();
  return secret;
}

}  // namespace tutti::gpu
