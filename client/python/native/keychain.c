/* tutti._keychain: SHA-256 key chains in C: the vLLM connector's (tutti.vllm.keys, derive) and
 * tutti.chain_keys's "tutti-sha256-v1" (chain_v1).
 *
 * Key scheme "tutti-vllm-keys-v2". For block i of a request (block_size tokens):
 *   digest_i = SHA-256(tokens as 4-byte little-endian unsigned ints | digest_{i-1} | extra_i)
 * where extra_i is the block's encoded vLLM extra keys (keys.encode_extra_keys; b"\x00" for
 * none). The same bytes as the pure-Python derivation in keys.py, which stays the reference and
 * the fallback wherever this module does not load (vllm_keys_test checks both agree).
 *
 * Why the tokens come first: the message's leading 64-byte chunks hold only the block's own
 * tokens (all of them at block size 16), so their compression does not wait for the previous
 * digest. derive() compresses block i+1's token chunks together with block i's chained tail
 * (the rest of its tokens, digest_{i-1}, extra_i, padding), two independent streams whose SHA
 * instructions overlap in the pipeline: a 2048-block chain costs about one chained
 * compression per block instead of three (v1's 8-byte tokens after the digest).
 *
 * SHA-256 is compressed with the x86 SHA extensions when the CPU has them (checked once, CPUID),
 * else with portable C. Built against CPython's limited API (abi3, 3.8+) so the one .so loads
 * in any CPython 3 environment of the platform (vLLM's virtual environments included).
 *
 * derive(last, tokens, block_size, extras[, first[, nblocks]]) -> (keys, last)
 *   last:   the previous block's 32-byte digest (the chain's root for block 0)
 *   tokens: a list (or tuple) of ints, a whole number of blocks
 *   extras: None (no block has extra keys) or a list of one bytes object per block
 *   first:  the request's position of tokens[0] (error messages name a token by it)
 *   nblocks: given (>= 0), tokens is the request's whole list and the blocks are its
 *           tokens[first : first + nblocks * block_size], read in place (no slice: a copy of
 *           32K items took 80 us of the scheduler's first call); ValueError if it is shorter
 *   keys:   the blocks' 16-byte keys concatenated; last: the last block's digest
 * ValueError for a token that is not an int in [0, 2^32) or arguments that do not fit.
 * chain_v1(parent, tokens, block_tokens) -> keys
 *   "tutti-sha256-v1" (tutti/_hash.py, the reference and the fallback):
 *   key_i = SHA-256(key_{i-1} | uint32le(block_tokens) | block i's tokens as uint32le)[0:16],
 *   key_{-1} = parent (16 bytes); the full blocks of tokens (a list or tuple of ints), keys
 *   concatenated (16 bytes each). ValueError for a token that is not an int in [0, 2^32) (the
 *   caller then masks them in Python).
 * Tests: sha256(data), implementation() ("sha-ni" or "portable"), use_portable(bool).
 */
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TUTTI_X86 1
#endif

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

typedef void (*compress_fn)(uint32_t state[8], const uint8_t* data, size_t blocks);

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void compress_portable(uint32_t state[8], const uint8_t* data, size_t blocks) {
  uint32_t w[64];
  while (blocks--) {
    for (int i = 0; i < 16; i++) {
      w[i] = ((uint32_t)data[4 * i] << 24) | ((uint32_t)data[4 * i + 1] << 16) |
             ((uint32_t)data[4 * i + 2] << 8) | (uint32_t)data[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
      uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; i++) {
      uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) +
                    K256[i] + w[i];
      uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
    data += 64;
  }
}

#ifdef TUTTI_X86
/* The SHA extensions (SHA256RNDS2, SHA256MSG1/2): four rounds per two instructions. */
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_shani(uint32_t state[8],
                                                                      const uint8_t* data,
                                                                      size_t blocks) {
  const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128((const __m128i*)&state[0]);
  __m128i st1 = _mm_loadu_si128((const __m128i*)&state[4]);
  tmp = _mm_shuffle_epi32(tmp, 0xB1);            /* CDAB */
  st1 = _mm_shuffle_epi32(st1, 0x1B);            /* EFGH */
  __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);    /* ABEF */
  st1 = _mm_blend_epi16(st1, tmp, 0xF0);         /* CDGH */
  while (blocks--) {
    const __m128i abef = st0, cdgh = st1;
    __m128i m[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
      m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(data + 16 * i)), mask);
    }
    /* Unrolled (m[] stays in registers, no branches): 1.6x faster than the loop. */
#pragma GCC unroll 16
    for (int g = 0; g < 16; g++) {
      __m128i cur = m[g & 3];
      __m128i msg = _mm_add_epi32(cur, _mm_loadu_si128((const __m128i*)&K256[4 * g]));
      st1 = _mm_sha256rnds2_epu32(st1, st0, msg);
      if (g >= 3 && g <= 14) { /* W[4(g+1) .. 4(g+1)+3] */
        __m128i prev = m[(g + 3) & 3];
        __m128i next = _mm_add_epi32(m[(g + 1) & 3], _mm_alignr_epi8(cur, prev, 4));
        m[(g + 1) & 3] = _mm_sha256msg2_epu32(next, cur);
      }
      msg = _mm_shuffle_epi32(msg, 0x0E);
      st0 = _mm_sha256rnds2_epu32(st0, st1, msg);
      if (g >= 1 && g <= 12) {
        m[(g + 3) & 3] = _mm_sha256msg1_epu32(m[(g + 3) & 3], cur);
      }
    }
    st0 = _mm_add_epi32(st0, abef);
    st1 = _mm_add_epi32(st1, cdgh);
    data += 64;
  }
  tmp = _mm_shuffle_epi32(st0, 0x1B);            /* FEBA */
  st1 = _mm_shuffle_epi32(st1, 0xB1);            /* DCHG */
  st0 = _mm_blend_epi16(tmp, st1, 0xF0);         /* DCBA */
  st1 = _mm_alignr_epi8(st1, tmp, 8);            /* ABEF */
  _mm_storeu_si128((__m128i*)&state[0], st0);
  _mm_storeu_si128((__m128i*)&state[4], st1);
}

/* One 64-byte chunk of each of two independent messages: the two dependency chains of
 * SHA256RNDS2 interleave (the instruction's latency, not its throughput, bounds one stream). */
#define SHANI_LOAD(state, s0, s1)                                   \
  do {                                                              \
    __m128i t_ = _mm_loadu_si128((const __m128i*)&(state)[0]);      \
    s1 = _mm_loadu_si128((const __m128i*)&(state)[4]);              \
    t_ = _mm_shuffle_epi32(t_, 0xB1);  /* CDAB */                   \
    s1 = _mm_shuffle_epi32(s1, 0x1B);  /* EFGH */                   \
    s0 = _mm_alignr_epi8(t_, s1, 8);   /* ABEF */                   \
    s1 = _mm_blend_epi16(s1, t_, 0xF0); /* CDGH */                  \
  } while (0)
#define SHANI_STORE(state, s0, s1)                                  \
  do {                                                              \
    __m128i t_ = _mm_shuffle_epi32(s0, 0x1B); /* FEBA */            \
    s1 = _mm_shuffle_epi32(s1, 0xB1);         /* DCHG */            \
    s0 = _mm_blend_epi16(t_, s1, 0xF0);       /* DCBA */            \
    s1 = _mm_alignr_epi8(s1, t_, 8);          /* ABEF */            \
    _mm_storeu_si128((__m128i*)&(state)[0], s0);                    \
    _mm_storeu_si128((__m128i*)&(state)[4], s1);                    \
  } while (0)
/* Four rounds (group g of 16) of one stream: st0/st1 its ABEF/CDGH, m its schedule. */
#define SHANI_GROUP(g, st0, st1, m)                                                        \
  do {                                                                                     \
    __m128i cur_ = m[(g) & 3];                                                             \
    __m128i msg_ = _mm_add_epi32(cur_, _mm_loadu_si128((const __m128i*)&K256[4 * (g)]));   \
    st1 = _mm_sha256rnds2_epu32(st1, st0, msg_);                                           \
    if ((g) >= 3 && (g) <= 14) {                                                           \
      __m128i next_ = _mm_add_epi32(m[((g) + 1) & 3], _mm_alignr_epi8(cur_, m[((g) + 3) & 3], 4)); \
      m[((g) + 1) & 3] = _mm_sha256msg2_epu32(next_, cur_);                                \
    }                                                                                      \
    msg_ = _mm_shuffle_epi32(msg_, 0x0E);                                                  \
    st0 = _mm_sha256rnds2_epu32(st0, st1, msg_);                                           \
    if ((g) >= 1 && (g) <= 12) m[((g) + 3) & 3] = _mm_sha256msg1_epu32(m[((g) + 3) & 3], cur_); \
  } while (0)

__attribute__((target("sha,sse4.1,ssse3"))) static void compress_pair_shani(
    uint32_t sa[8], const uint8_t* da, uint32_t sb[8], const uint8_t* db) {
  const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i a0, a1, b0, b1;
  SHANI_LOAD(sa, a0, a1);
  SHANI_LOAD(sb, b0, b1);
  const __m128i a0s = a0, a1s = a1, b0s = b0, b1s = b1;
  __m128i ma[4], mb[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    ma[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(da + 16 * i)), mask);
    mb[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(db + 16 * i)), mask);
  }
#pragma GCC unroll 16
  for (int g = 0; g < 16; g++) {
    SHANI_GROUP(g, a0, a1, ma);
    SHANI_GROUP(g, b0, b1, mb);
  }
  a0 = _mm_add_epi32(a0, a0s);
  a1 = _mm_add_epi32(a1, a1s);
  b0 = _mm_add_epi32(b0, b0s);
  b1 = _mm_add_epi32(b1, b1s);
  SHANI_STORE(sa, a0, a1);
  SHANI_STORE(sb, b0, b1);
}

static int have_shani(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (!(c & (1u << 9)) || !(c & (1u << 19))) return 0; /* SSSE3, SSE4.1 */
  if (__get_cpuid_max(0, 0) < 7) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  return (b >> 29) & 1; /* SHA */
}
#endif

typedef void (*compress_pair_fn)(uint32_t sa[8], const uint8_t* da, uint32_t sb[8],
                                 const uint8_t* db);

static void compress_pair_portable(uint32_t sa[8], const uint8_t* da, uint32_t sb[8],
                                   const uint8_t* db) {
  compress_portable(sa, da, 1);
  compress_portable(sb, db, 1);
}

static compress_fn compress = compress_portable;
static compress_pair_fn compress_pair = compress_pair_portable;

/* na chunks of message a into sa and nb chunks of message b into sb (independent of each
 * other): as many in pairs as both have, the rest alone. */
static void compress_two(uint32_t sa[8], const uint8_t* da, size_t na, uint32_t sb[8],
                         const uint8_t* db, size_t nb) {
  for (; na > 0 && nb > 0; na--, nb--, da += 64, db += 64) compress_pair(sa, da, sb, db);
  if (na) compress(sa, da, na);
  if (nb) compress(sb, db, nb);
}

/* SHA-256 of msg[0, len) into out (32 bytes); buf: scratch of at least len + 72 bytes. */
static void sha256(const uint8_t* msg, size_t len, uint8_t* buf, uint8_t out[32]) {
  uint32_t st[8];
  memcpy(st, H0, sizeof st);
  size_t whole = len / 64;
  if (whole) compress(st, msg, whole);
  size_t rest = len - whole * 64;
  size_t tail = rest + 9 <= 64 ? 64 : 128;
  memset(buf, 0, tail);
  memcpy(buf, msg + whole * 64, rest);
  buf[rest] = 0x80;
  uint64_t bits = (uint64_t)len * 8;
  for (int i = 0; i < 8; i++) buf[tail - 1 - i] = (uint8_t)(bits >> (8 * i));
  compress(st, buf, tail / 64);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(st[i] >> 24);
    out[4 * i + 1] = (uint8_t)(st[i] >> 16);
    out[4 * i + 2] = (uint8_t)(st[i] >> 8);
    out[4 * i + 3] = (uint8_t)st[i];
  }
}

static inline void put_le32(uint8_t* p, uint32_t u) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  memcpy(p, &u, 4); /* one store */
#else
  for (int k = 0; k < 4; k++) p[k] = (uint8_t)(u >> (8 * k));
#endif
}

static void put_digest(const uint32_t st[8], uint8_t out[32]) {
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(st[i] >> 24);
    out[4 * i + 1] = (uint8_t)(st[i] >> 16);
    out[4 * i + 2] = (uint8_t)(st[i] >> 8);
    out[4 * i + 3] = (uint8_t)st[i];
  }
}

static PyObject* item(PyObject* seq, int is_list, Py_ssize_t i) {
  return is_list ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i); /* borrowed */
}

/* tokens[at, at + n) as 4-byte little-endian unsigned ints into out; -1 with ValueError naming
 * the first token that is not an int in [0, 2^32) (`first`: the request's position of
 * tokens[at]). */
static int pack_tokens(PyObject* tokens, int is_list, Py_ssize_t at, Py_ssize_t n,
                       Py_ssize_t first, uint8_t* out) {
  for (Py_ssize_t j = 0; j < n; j++, out += 4) {
    /* Bounds-checked, and held unless an exact int: another type's __index__ may run Python
     * code (that changes the list, say); an error, never a crash. An exact int runs none
     * (the common case: no reference counting). */
    PyObject* t = item(tokens, is_list, at + j);
    long long v = -1;
    if (t != NULL && PyLong_CheckExact(t)) {
      v = PyLong_AsLongLong(t);
      if (v >= 0 && v <= 0xFFFFFFFFLL) {
        put_le32(out, (uint32_t)v);
        continue;
      }
      Py_INCREF(t); /* for the message below */
    } else if (t != NULL) {
      Py_INCREF(t);
      v = PyLong_AsLongLong(t);
      if (!PyErr_Occurred() && v >= 0 && v <= 0xFFFFFFFFLL) {
        Py_DECREF(t);
        put_le32(out, (uint32_t)v);
        continue;
      }
    }
    PyErr_Clear();
    if (t == NULL) {
      PyErr_Format(PyExc_ValueError, "token %zd: the token list changed while keyed", first + j);
    } else {
      PyErr_Format(PyExc_ValueError, "token %zd is not an integer in [0, 2^32): %R", first + j,
                   t);
      Py_DECREF(t);
    }
    return -1;
  }
  return 0;
}

static PyObject* derive(PyObject* self, PyObject* args) {
  (void)self;
  const char* root;
  Py_ssize_t root_len, bs, first = 0, nblocks = -1;
  PyObject *tokens, *extras;
  if (!PyArg_ParseTuple(args, "y#OnO|nn", &root, &root_len, &tokens, &bs, &extras, &first,
                        &nblocks)) {
    return NULL;
  }
  if (root_len != 32) {
    PyErr_Format(PyExc_ValueError, "derive: last digest is %zd bytes, not 32", root_len);
    return NULL;
  }
  int is_list = PyList_Check(tokens);
  if (!is_list && !PyTuple_Check(tokens)) {
    PyErr_SetString(PyExc_TypeError, "derive: tokens must be a list or tuple of ints");
    return NULL;
  }
  Py_ssize_t ntok = is_list ? PyList_Size(tokens) : PyTuple_Size(tokens);
  Py_ssize_t at = 0; /* tokens[at] is the first block's first token */
  if (bs <= 0 || bs > (1 << 20)) {
    PyErr_Format(PyExc_ValueError, "derive: block size %zd", bs);
    return NULL;
  }
  if (nblocks >= 0) {
    if (first < 0 || nblocks > (PY_SSIZE_T_MAX - first) / bs || first + nblocks * bs > ntok) {
      PyErr_Format(PyExc_ValueError, "derive: %zd blocks of %zd from token %zd: the list has "
                   "%zd tokens", nblocks, bs, first, ntok);
      return NULL;
    }
    at = first;
    ntok = nblocks * bs;
  } else if (ntok % bs) {
    PyErr_Format(PyExc_ValueError, "derive: %zd tokens are not whole blocks of %zd", ntok, bs);
    return NULL;
  }
  Py_ssize_t n = ntok / bs;
  if (extras == Py_None) {
    extras = NULL;
  } else {
    if (!PyList_Check(extras) || PyList_Size(extras) != n) {
      PyErr_Format(PyExc_ValueError, "derive: extras must be None or a list of %zd bytes", n);
      return NULL;
    }
    extras = PySequence_Tuple(extras); /* our own: the blocks' encodings stay put */
    if (extras == NULL) return NULL;
  }
  Py_ssize_t max_extra = 1;
  for (Py_ssize_t i = 0; extras != NULL && i < n; i++) {
    PyObject* e = PyTuple_GetItem(extras, i);
    if (!PyBytes_Check(e)) {
      PyErr_Format(PyExc_TypeError, "derive: extras[%zd] is not bytes", i);
      Py_DECREF(extras);
      return NULL;
    }
    if (PyBytes_Size(e) > max_extra) max_extra = PyBytes_Size(e);
  }
  /* A block's message: its tokens (width bytes), of which the first `whole` 64-byte chunks are
   * compressed without the chain; the tail (the remaining token bytes, the previous digest,
   * the extra keys, the padding) is compressed from that midstate once the previous digest is
   * known. */
  const size_t width = 4 * (size_t)bs, whole = width / 64, rest = width - 64 * whole;
  size_t tail_cap = rest + 32 + (size_t)max_extra + 72;
  uint8_t* packed = PyMem_Malloc(4 * (size_t)ntok + 1);
  uint8_t* tail = PyMem_Malloc(tail_cap);
  PyObject* keys = PyBytes_FromStringAndSize(NULL, 16 * n);
  if (packed == NULL || tail == NULL || keys == NULL) {
    PyMem_Free(packed);
    PyMem_Free(tail);
    Py_XDECREF(keys);
    Py_XDECREF(extras);
    return keys == NULL ? NULL : PyErr_NoMemory();
  }
  if (pack_tokens(tokens, is_list, at, ntok, first, packed) < 0) {
    PyMem_Free(packed);
    PyMem_Free(tail);
    Py_DECREF(keys);
    Py_XDECREF(extras);
    return NULL;
  }
  uint8_t* out = (uint8_t*)PyBytes_AsString(keys);
  uint8_t last[32];
  memcpy(last, root, 32);
  uint32_t mid[8], next[8];
  memcpy(next, H0, sizeof next);
  if (n > 0 && whole > 0) compress(next, packed, whole); /* block 0's token chunks */
  size_t padded_len = 0; /* the tail length the padding in `tail` was written for; none yet */
  for (Py_ssize_t b = 0; b < n; b++) {
    const uint8_t* blk = packed + (size_t)b * width;
    memcpy(mid, next, sizeof mid);
    size_t len = rest;
    memcpy(tail, blk + 64 * whole, rest);
    memcpy(tail + len, last, 32);
    len += 32;
    if (extras == NULL) {
      tail[len++] = 0x00;
    } else {
      PyObject* e = PyTuple_GetItem(extras, b);
      Py_ssize_t el = PyBytes_Size(e);
      memcpy(tail + len, PyBytes_AsString(e), (size_t)el);
      len += (size_t)el;
    }
    /* Padding for the whole message (64 * whole bytes before the tail); rewritten only when the
     * tail's length changes (every byte before it is rewritten per block). */
    const size_t chunks = (len + 9 + 63) / 64;
    if (len != padded_len) {
      memset(tail + len, 0, chunks * 64 - len);
      tail[len] = 0x80;
      uint64_t bits = (uint64_t)(64 * whole + len) * 8;
      for (int i = 0; i < 8; i++) tail[chunks * 64 - 1 - i] = (uint8_t)(bits >> (8 * i));
      padded_len = len;
    }
    if (b + 1 < n && whole > 0) {
      memcpy(next, H0, sizeof next);
      compress_two(mid, tail, chunks, next, blk + width, whole);
    } else {
      compress(mid, tail, chunks);
    }
    put_digest(mid, last);
    memcpy(out + 16 * b, last, 16);
  }
  Py_XDECREF(extras);
  PyMem_Free(packed);
  PyMem_Free(tail);
  PyObject* digest = PyBytes_FromStringAndSize((const char*)last, 32);
  if (digest == NULL) {
    Py_DECREF(keys);
    return NULL;
  }
  PyObject* res = PyTuple_New(2);
  if (res == NULL) {
    Py_DECREF(keys);
    Py_DECREF(digest);
    return NULL;
  }
  PyTuple_SetItem(res, 0, keys);
  PyTuple_SetItem(res, 1, digest);
  return res;
}

static PyObject* chain_v1(PyObject* self, PyObject* args) {
  (void)self;
  const char* parent;
  Py_ssize_t parent_len, bs;
  PyObject* tokens;
  if (!PyArg_ParseTuple(args, "y#On", &parent, &parent_len, &tokens, &bs)) return NULL;
  if (parent_len != 16) {
    PyErr_SetString(PyExc_ValueError, "parent must be 16 bytes");
    return NULL;
  }
  const int is_list = PyList_Check(tokens);
  if (!is_list && !PyTuple_Check(tokens)) {
    PyErr_SetString(PyExc_TypeError, "tokens must be a list or a tuple");
    return NULL;
  }
  if (bs <= 0 || bs > (1 << 20)) {
    PyErr_SetString(PyExc_ValueError, "block_tokens must be in [1, 2^20]");
    return NULL;
  }
  const Py_ssize_t n = is_list ? PyList_Size(tokens) : PyTuple_Size(tokens);
  const Py_ssize_t blocks = n / bs;
  PyObject* keys = PyBytes_FromStringAndSize(NULL, blocks * 16);
  if (keys == NULL) return NULL;
  uint8_t* out = (uint8_t*)PyBytes_AsString(keys);
  const size_t len = 20 + 4 * (size_t)bs; /* the previous key, block_tokens, the tokens */
  uint8_t* msg = PyMem_Malloc(2 * len + 72);
  if (msg == NULL) {
    Py_DECREF(keys);
    return PyErr_NoMemory();
  }
  uint8_t* scratch = msg + len;
  memcpy(msg, parent, 16);
  put_le32(msg + 16, (uint32_t)bs);
  for (Py_ssize_t b = 0; b < blocks; b++) {
    if (pack_tokens(tokens, is_list, b * bs, bs, b * bs, msg + 20) < 0) {
      PyMem_Free(msg);
      Py_DECREF(keys);
      return NULL;
    }
    uint8_t digest[32];
    sha256(msg, len, scratch, digest);
    memcpy(out + 16 * b, digest, 16);
    memcpy(msg, digest, 16);
  }
  PyMem_Free(msg);
  return keys;
}

static PyObject* sha256_py(PyObject* self, PyObject* args) {
  (void)self;
  const char* data;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "y#", &data, &len)) return NULL;
  uint8_t* scratch = PyMem_Malloc((size_t)len + 128);
  if (scratch == NULL) return PyErr_NoMemory();
  uint8_t out[32];
  sha256((const uint8_t*)data, (size_t)len, scratch, out);
  PyMem_Free(scratch);
  return PyBytes_FromStringAndSize((const char*)out, 32);
}

static PyObject* implementation(PyObject* self, PyObject* args) {
  (void)self;
  (void)args;
  return PyUnicode_FromString(compress == compress_portable ? "portable" : "sha-ni");
}

static void use_best(int portable) {
  compress = compress_portable;
  compress_pair = compress_pair_portable;
#ifdef TUTTI_X86
  if (!portable && have_shani()) {
    compress = compress_shani;
    compress_pair = compress_pair_shani;
  }
#endif
}

static PyObject* use_portable(PyObject* self, PyObject* arg) {
  (void)self;
  int on = PyObject_IsTrue(arg);
  if (on < 0) return NULL;
  use_best(on);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"derive", derive, METH_VARARGS,
     "derive(last, tokens, block_size, extras[, first[, nblocks]]) -> (keys, last)"},
    {"chain_v1", chain_v1, METH_VARARGS,
     "chain_v1(parent, tokens, block_tokens) -> keys (tutti-sha256-v1, concatenated)"},
    {"sha256", sha256_py, METH_VARARGS, "sha256(data) -> digest (tests)"},
    {"implementation", implementation, METH_NOARGS, "'sha-ni' or 'portable'"},
    {"use_portable", use_portable, METH_O,
     "use_portable(True): compress in portable C; False: the fastest this CPU has (tests)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "tutti._keychain",
                                    "tutti's SHA-256 key chains in C",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__keychain(void) {
  use_best(0);
  return PyModule_Create(&module);
}
