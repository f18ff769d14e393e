// eqxopt's step kernel for leaves with moments stored in a narrower form:
// block-wise quantized (8-bit and 4-bit `QuantizedArray`s), companded
// (`Companded8bit`) or bf16 with an int8 residual (`ErrorCorrectedBf16`), called
// through `jax.ffi`.
//
// Part of the one library (`library.cc`): it shares the registry of rule
// functions and the thread pool (`common.h`) with `elementwise.cc`. For each chunk
// of a leaf (the least common multiple of its moments' block sizes) the handler
// dequantizes the codes into a buffer the size of the chunk (`map[code] * absmax`),
// runs the rule's generated function on it (the one `_fused.py` writes for float32
// leaves), takes each block's absmax of the new moments and stores them again, with
// the codes torchao's binary search gives, found by `_storage.search_tables`' two
// look-ups. Codes and scales are written over the old ones: a leaf's moments never
// exist as float32 arrays the size of the leaf.
//
// Each piece has vector forms, chosen by the CPU at run time (the library itself is
// built for any x86-64): dequantizing 8-bit codes by byte look-ups (AVX-512 VBMI,
// else AVX2 gathers), 4-bit codes by register permutes (AVX-512, else AVX2), the
// absmax as an integer maximum of the magnitudes' bits, and the code search either
// by a branchless binary search over the map's thresholds held in registers
// (AVX-512: the code is the number of thresholds at most `y`, as
// `_storage.search_tables` defines them; 8-bit with VBMI and GFNI: over the top
// halves of their order keys, 32 to a register, then one exact correction) or by
// one gather per vector (AVX2). Every float operation is the scalar code's, so
// every path gives the same bits.
//
// Arguments: `scalars`, then `g` and `p` (float32, n elements), then per moment
// either its float32 values (n) or, quantized, six buffers: `codes` (uint8
// (blocks, block) or (blocks, block / 2) for 4-bit), `absmax` (float32, blocks), the
// map (float32, 256 or 16 entries), the buckets (int32, `_quantized.search_entries`),
// their `shift` and `low` (int32[2]) and the thresholds (float32, one per map entry,
// the last NaN); companded, four: `codes` (uint8 (groups, group)), the float16
// scales, the table (float32, 256: `_storage.companded_table`) and the map's
// sign (int32[1]); error-corrected, two: the bf16 values and the int8 residuals
// (n each). Results: the rule's first output (float32, n), then per moment its
// values, or its codes and scales, or its values and residuals.

#include "common.h"

#include <cmath>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// How a moment is stored: float32 values, torchao's block-wise codes (8-bit or
// 4-bit), FlashOptim's companded codes (`Companded8bit`), or bf16 values with an
// int8 error-correction residual (`ErrorCorrectedBf16`).
enum class Kind { kFloat32, kBlockwise, kCompanded, kErrorCorrected };

struct QuantizedMoment {
  Kind kind = Kind::kFloat32;
  bool quantized = false;  // block-wise
  // Companded: the float16 scales' bits, the 256 values the codes read back as
  // before their scale (`_storage.companded_table`), and whether it is the
  // signed map (else the unsigned one, stored by its square root).
  const uint16_t* scales_in = nullptr;
  uint16_t* scales_out = nullptr;
  const float* table = nullptr;
  bool signed_map = false;
  // Error-corrected: the bf16 values' bits and the int8 residuals.
  const uint16_t* bf16_in = nullptr;
  uint16_t* bf16_out = nullptr;
  const int8_t* residual_in = nullptr;
  int8_t* residual_out = nullptr;
  const float* values_in = nullptr;
  float* values_out = nullptr;
  const uint8_t* codes_in = nullptr;
  uint8_t* codes_out = nullptr;
  const float* absmax_in = nullptr;
  float* absmax_out = nullptr;
  const float* map = nullptr;
  const int32_t* buckets = nullptr;
  int64_t levels = 0, block = 0, n_blocks = 0, n_buckets = 0;
  int shift = 0;
  int32_t low = 0;
  bool packed = false;
  const float* thresholds = nullptr;
  // Byte k of every 8-bit map entry, for `DecodeVbmi`.
  alignas(64) uint8_t planes[4][256];
  // The thresholds each step of `Search256`'s or `Search16`'s binary search
  // compares with, by the code so far (`StepTables`).
  alignas(64) float steps[10][32];
  // 8-bit, for `CodesVbmi`, the top halves of the thresholds' order keys
  // (`Key16`) its steps compare with, by the code so far over 8 (`w`): `t[8 w + s
  // - 1]` for strides s = 64 to 4 (`step_words`, 32 entries: one register each). Then
  // by `u` = w + 32 * (code bit 2), that is by the code so far over 4 `q` = 2 (u %
  // 32) + u / 32 (`finals`, 64 entries): the top halves of `t[4 q + 1]`, `t[4 q]`,
  // `t[4 q + 2]`, `t[4 q - 1]`, and the low halves of `t[4 q - 1]`, `t[4 q + 1]`,
  // `t[4 q]`, `t[4 q + 2]`; `word_search` if no two thresholds share a top half.
  alignas(64) int16_t step_words[5][32];
  alignas(64) int16_t finals[8][64];
  bool word_search = false;
};

// `m.steps` from `m.thresholds`. 8-bit: the search's code so far is a multiple of
// 8 (`8 * i`) up to its last three steps; table j < 4 holds the threshold the
// step of stride 32, 16, 8, 4 compares with (`t[8 i + stride - 1]`), tables 4 and
// 5 those of stride 2 (`t[8 i + 1]`, `t[8 i + 5]`), tables 6 to 9 those of
// stride 1 (`t[8 i + 2 j']`). 4-bit: by the code so far `i`, `t[i + 3]`,
// `t[i + 1]` and `t[i]` (strides 4, 2, 1). Past the end: the last (NaN) entry.
// The order key of float32 `t`: its bits, those under the sign flipped where `t`
// is negative (increasing in `t`); NaN: above every number's.
int32_t Key(float t) {
  if (t != t) return 0x7FFFFFFF;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  return bits < 0 ? bits ^ 0x7FFFFFFF : bits;
}

int16_t Key16(float t) { return static_cast<int16_t>(Key(t) >> 16); }
int16_t Low16(float t) { return static_cast<int16_t>(Key(t) & 0xFFFF); }

void StepTables(QuantizedMoment& m) {
  const int64_t last = m.levels - 1;
  auto t = [&](int64_t c) { return m.thresholds[std::min(c, last)]; };
  if (m.levels == 256) {
    for (int64_t w = 0; w < 32; ++w) {
      for (int j = 0; j < 5; ++j) m.step_words[j][w] = Key16(t(8 * w + (64 >> j) - 1));
    }
    for (int64_t u = 0; u < 64; ++u) {
      const int64_t q = 2 * (u % 32) + u / 32;
      m.finals[0][u] = Key16(t(4 * q + 1));
      m.finals[1][u] = Key16(t(4 * q));
      m.finals[2][u] = Key16(t(4 * q + 2));
      // No threshold below code 0: a top half no clamped `y` has.
      m.finals[3][u] = q == 0 ? INT16_MIN : Key16(t(4 * q - 1));
      m.finals[4][u] = q == 0 ? 0 : Low16(t(4 * q - 1));
      m.finals[5][u] = Low16(t(4 * q + 1));
      m.finals[6][u] = Low16(t(4 * q));
      m.finals[7][u] = Low16(t(4 * q + 2));
    }
    // Each top half holds at most one threshold, none is zero (-0 and 0 have
    // different keys) and all lie in [-1, 1] (`y` is clamped to [-1.5, 1.5]).
    m.word_search = true;
    for (int64_t c = 0; c + 1 < last; ++c) {
      if (Key16(t(c)) == Key16(t(c + 1))) m.word_search = false;
    }
    for (int64_t c = 0; c < last; ++c) {
      if (!(std::fabs(t(c)) <= 1.0f) || t(c) == 0.0f) m.word_search = false;
    }
    for (int64_t i = 0; i < 32; ++i) {
      const int64_t strides[4] = {32, 16, 8, 4};
      for (int j = 0; j < 4; ++j) m.steps[j][i] = t(8 * i + strides[j] - 1);
      m.steps[4][i] = t(8 * i + 1);
      m.steps[5][i] = t(8 * i + 5);
      for (int j = 0; j < 4; ++j) m.steps[6 + j][i] = t(8 * i + 2 * j);
    }
  } else {
    for (int64_t i = 0; i < 16; ++i) {
      m.steps[0][i] = t(i + 3);
      m.steps[1][i] = t(i + 1);
      m.steps[2][i] = t(i);
    }
  }
}

// torchao's code for `y` (`_quantized.search_entries`), from a moment's tables
// copied into locals (stores through `uint8_t*` may alias anything, so members
// would be read again for every element).
struct Search {
  const int32_t* buckets;
  int32_t k, shift, start, last, mask;

  explicit Search(const QuantizedMoment& m)
      : buckets(m.buckets), k(static_cast<int32_t>(m.n_buckets / 2)), shift(m.shift),
        start(m.low << m.shift),
        last(static_cast<int32_t>((m.n_buckets / 2) << m.shift) - 1),
        mask((1 << m.shift) - 1) {}

  inline uint32_t operator()(float y) const {
    int32_t bits;
    std::memcpy(&bits, &y, sizeof bits);
    int32_t rel = (bits & 0x7FFFFFFF) - start;
    rel = rel < 0 ? 0 : (rel > last ? last : rel);
    const int32_t index = rel >> shift;
    const bool negative = bits < 0;
    const int32_t key = negative ? k - 1 - index : k + index;
    const int32_t within = negative ? mask - (rel & mask) : rel & mask;
    const uint32_t entry = static_cast<uint32_t>(buckets[key]);
    const int32_t offset = static_cast<int32_t>(entry & 0xFFFFFF);
    const uint32_t code = (entry >> 24) + (within >= offset ? 1u : 0u);
    return y != y ? 0u : code;
  }
};

// The largest of `result` and `bits[k] & 0x7FFFFFFF` (|x| as an integer) for
// i <= k < n: the scalar end of each form of `Largest`.
inline int32_t LargestFrom(const float* x, int64_t i, int64_t n, int32_t result) {
  for (; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= 0x7FFFFFFF;
    result = bits > result ? bits : result;
  }
  return result;
}

// XLA's maximum: NaN if either is.
inline float NanMax(float a, float b) { return (a > b || a != a) ? a : b; }

// `out[i] = code(x[i] * inverse)` for i < n.
void Codes(const Search& code, const float* x, int64_t n, float inverse,
           uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = code(x[i] * inverse);
}

#if defined(__x86_64__)
// The same, eight at a time (AVX2 gathers from the tables).
__attribute__((target("avx2"))) void CodesAvx2(const Search& code, const float* x,
                                               int64_t n, float inverse,
                                               uint8_t* out) {
  const __m256 scale = _mm256_set1_ps(inverse);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  const __m128i shift = _mm_cvtsi32_si128(code.shift);
  const __m256i start = _mm256_set1_epi32(code.start);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i last = _mm256_set1_epi32(code.last);
  const __m256i mask = _mm256_set1_epi32(code.mask);
  const __m256i k = _mm256_set1_epi32(code.k);
  const __m256i k1 = _mm256_set1_epi32(code.k - 1);
  const __m256i offsets = _mm256_set1_epi32(0xFFFFFF);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), scale);
    const __m256i bits = _mm256_castps_si256(y);
    __m256i rel = _mm256_sub_epi32(_mm256_and_si256(bits, magnitude), start);
    rel = _mm256_min_epi32(_mm256_max_epi32(rel, zero), last);
    const __m256i index = _mm256_srl_epi32(rel, shift);
    const __m256i negative = _mm256_srai_epi32(bits, 31);
    const __m256i key = _mm256_blendv_epi8(_mm256_add_epi32(k, index),
                                           _mm256_sub_epi32(k1, index), negative);
    // mask - w is w ^ mask for w <= mask.
    const __m256i within = _mm256_xor_si256(_mm256_and_si256(rel, mask),
                                            _mm256_and_si256(negative, mask));
    const __m256i entry = _mm256_i32gather_epi32(code.buckets, key, 4);
    // `below` is -1 where within < offset (no rounding up); NaN: code 0.
    const __m256i below =
        _mm256_cmpgt_epi32(_mm256_and_si256(entry, offsets), within);
    const __m256i up = _mm256_add_epi32(below, _mm256_set1_epi32(1));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    const __m256i codes = _mm256_andnot_si256(
        nan, _mm256_add_epi32(_mm256_srli_epi32(entry, 24), up));
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(codes),
                                           _mm256_extracti128_si256(codes, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(words, words));
  }
  for (; i < n; ++i) out[i] = code(x[i] * inverse);
}

// `out[i] = map[codes[i]] * scale` for i < n, eight at a time.
__attribute__((target("avx2"))) void DecodeAvx2(const float* map, const uint8_t* codes,
                                                int64_t n, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 values = _mm256_i32gather_ps(map, _mm256_cvtepu8_epi32(bytes), 4);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(values, s));
  }
  for (; i < n; ++i) out[i] = map[codes[i]] * scale;
}

// The largest of `bits[i] & 0x7FFFFFFF` (|x| as an integer), i < n.
__attribute__((target("avx2"))) int32_t LargestAvx2(const float* x, int64_t n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i largest = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    largest = _mm256_max_epi32(largest, _mm256_and_si256(bits, magnitude));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), largest);
  int32_t result = 0;
  for (int32_t lane : lanes) result = lane > result ? lane : result;
  return LargestFrom(x, i, n, result);
}

// `out[i] = map[codes[i]] * scale` for i < n, 64 at a time with byte look-ups
// (AVX-512 VBMI): `planes[k][c]` is byte k of `map[c]`, so each plane is a 256-entry
// byte table, looked up 64 codes at a time by two `vpermi2b`, and the four bytes
// of each float are put together by unpacking. The codes are first permuted so
// that the unpacked floats come out in order.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void DecodeVbmi(
    const uint8_t (*planes)[256], const float* map, const uint8_t* codes, int64_t n,
    float scale, float* out) {
  __m512i table[4][4];
  for (int k = 0; k < 4; ++k)
    for (int q = 0; q < 4; ++q)
      table[k][q] = _mm512_loadu_si512(planes[k] + 64 * q);
  // Element j of the result vector r (its 128-bit lane l, place p within it) comes
  // from code 16 * r + 4 * l + p (unpacking keeps lanes apart).
  alignas(64) uint8_t order[64];
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < 4; ++l)
      for (int p = 0; p < 4; ++p) order[16 * l + 4 * r + p] = 16 * r + 4 * l + p;
  const __m512i permutation = _mm512_load_si512(order);
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i c =
        _mm512_permutexvar_epi8(permutation, _mm512_loadu_si512(codes + i));
    const __mmask64 high = _mm512_movepi8_mask(c);
    __m512i b[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i low = _mm512_permutex2var_epi8(table[k][0], c, table[k][1]);
      const __m512i up = _mm512_permutex2var_epi8(table[k][2], c, table[k][3]);
      b[k] = _mm512_mask_blend_epi8(high, low, up);
    }
    const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]);
    const __m512i hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]);
    const __m512i hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
    const __m512i r0 = _mm512_unpacklo_epi16(lo01, lo23);
    const __m512i r1 = _mm512_unpackhi_epi16(lo01, lo23);
    const __m512i r2 = _mm512_unpacklo_epi16(hi01, hi23);
    const __m512i r3 = _mm512_unpackhi_epi16(hi01, hi23);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_castsi512_ps(r0), s));
    _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(_mm512_castsi512_ps(r1), s));
    _mm512_storeu_ps(out + i + 32, _mm512_mul_ps(_mm512_castsi512_ps(r2), s));
    _mm512_storeu_ps(out + i + 48, _mm512_mul_ps(_mm512_castsi512_ps(r3), s));
  }
  for (; i < n; ++i) out[i] = map[codes[i]] * scale;
}

// Entry `index` (0 to 15) of a map held in two registers.
__attribute__((target("avx2"), always_inline)) inline __m256 LookUp16(
    __m256 low_half, __m256 high_half, __m256i index) {
  const __m256 low = _mm256_permutevar8x32_ps(low_half, index);
  const __m256 high = _mm256_permutevar8x32_ps(high_half, index);
  // Bit 3 of the index, moved to the sign bit, picks the half.
  return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)));
}

// `out[i] = map[code i] * scale` for the `n` (even) 4-bit codes packed in
// `codes` (two per byte, the first in the high half), sixteen at a time: the 16
// entries of the map are two registers, looked up by `vpermps`.
__attribute__((target("avx2"))) void DecodePackedAvx2(const float* map,
                                                      const uint8_t* codes, int64_t n,
                                                      float scale, float* out) {
  const __m256 low_half = _mm256_loadu_ps(map), high_half = _mm256_loadu_ps(map + 8);
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i nibble = _mm256_set1_epi32(0xF);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i wide = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2)));
    const __m256i high = _mm256_srli_epi32(wide, 4);
    const __m256i low = _mm256_and_si256(wide, nibble);
    const __m256 first = _mm256_mul_ps(LookUp16(low_half, high_half, high), s);
    const __m256 second = _mm256_mul_ps(LookUp16(low_half, high_half, low), s);
    // (f0 s0 f1 s1 | f4 s4 f5 s5) and (f2 s2 f3 s3 | f6 s6 f7 s7), then in order.
    const __m256 a = _mm256_unpacklo_ps(first, second);
    const __m256 b = _mm256_unpackhi_ps(first, second);
    _mm256_storeu_ps(out + i, _mm256_permute2f128_ps(a, b, 0x20));
    _mm256_storeu_ps(out + i + 8, _mm256_permute2f128_ps(a, b, 0x31));
  }
  for (; i + 1 < n; i += 2) {
    const uint8_t byte = codes[i / 2];
    out[i] = map[byte >> 4] * scale;
    out[i + 1] = map[byte & 0xF] * scale;
  }
}

// Lanes where `threshold <= y` (false where either is NaN).
__attribute__((target("avx512f"), always_inline)) inline __mmask16 AtMost(
    __m512 threshold, __m512 y) {
  return _mm512_cmp_ps_mask(threshold, y, _CMP_LE_OQ);
}

// Entry `index` (0 to 31) of a table held in two registers.
__attribute__((target("avx512f"), always_inline)) inline __m512 LookUp32(
    const __m512* table, __m512i index) {
  return _mm512_permutex2var_ps(table[0], index, table[1]);
}

// `DecodePackedAvx2`, 32 at a time: the map is one register.
__attribute__((target("avx512f"))) void DecodePackedAvx512(const float* map,
                                                          const uint8_t* codes,
                                                          int64_t n, float scale,
                                                          float* out) {
  const __m512 table = _mm512_loadu_ps(map);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i nibble = _mm512_set1_epi32(0xF);
  // Element j of the two results: the first (high) or second (low) code of byte j / 2.
  alignas(64) int32_t order[32];
  for (int j = 0; j < 32; ++j) order[j] = (j % 2 ? 16 : 0) + j / 2;
  const __m512i first_half = _mm512_load_si512(order);
  const __m512i second_half = _mm512_load_si512(order + 16);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i wide = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2)));
    const __m512 high = _mm512_mul_ps(
        _mm512_permutexvar_ps(_mm512_srli_epi32(wide, 4), table), s);
    const __m512 low =
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(wide, nibble), table), s);
    _mm512_storeu_ps(out + i, _mm512_permutex2var_ps(high, first_half, low));
    _mm512_storeu_ps(out + i + 16, _mm512_permutex2var_ps(high, second_half, low));
  }
  for (; i + 1 < n; i += 2) {
    const uint8_t byte = codes[i / 2];
    out[i] = map[byte >> 4] * scale;
    out[i + 1] = map[byte & 0xF] * scale;
  }
}

// The codes of `y` for a map of 256 entries, by binary search over its thresholds
// (`StepTables`), held in registers: `t <= y` compares (false for a NaN `y`: code
// 0) and no memory read. `kVectors` vectors of 16 at a time: each step waits on
// the one before, so several searches run side by side.
struct Search256 {
  __m512 table[10][2];
  __m512 t63, t127, t191;

  __attribute__((target("avx512f"), always_inline)) explicit Search256(
      const QuantizedMoment& m) {
    for (int j = 0; j < 10; ++j) {
      table[j][0] = _mm512_load_ps(m.steps[j]);
      table[j][1] = _mm512_load_ps(m.steps[j] + 16);
    }
    t63 = _mm512_set1_ps(m.thresholds[63]);
    t127 = _mm512_set1_ps(m.thresholds[127]);
    t191 = _mm512_set1_ps(m.thresholds[191]);
  }

  template <int kVectors>
  __attribute__((target("avx512f"), always_inline)) void Run(const float* x,
                                                             __m512 scale,
                                                             uint8_t* out) const {
    __m512 y[kVectors];
    __m512i index[kVectors];  // the code so far, over 8
    for (int u = 0; u < kVectors; ++u) {
      y[u] = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * u), scale);
      const __mmask16 up = AtMost(t127, y[u]);
      index[u] = _mm512_maskz_mov_epi32(up, _mm512_set1_epi32(16));
      const __mmask16 up64 = AtMost(_mm512_mask_blend_ps(up, t63, t191), y[u]);
      index[u] = _mm512_mask_add_epi32(index[u], up64, index[u], _mm512_set1_epi32(8));
    }
    for (int j = 0; j < 3; ++j) {
      for (int u = 0; u < kVectors; ++u) {
        const __mmask16 up = AtMost(LookUp32(table[j], index[u]), y[u]);
        index[u] =
            _mm512_mask_add_epi32(index[u], up, index[u], _mm512_set1_epi32(4 >> j));
      }
    }
    for (int u = 0; u < kVectors; ++u) {
      const __m512i i = index[u];
      const __mmask16 up4 = AtMost(LookUp32(table[3], i), y[u]);
      const __mmask16 up2 = AtMost(
          _mm512_mask_blend_ps(up4, LookUp32(table[4], i), LookUp32(table[5], i)),
          y[u]);
      const __m512 low =
          _mm512_mask_blend_ps(up2, LookUp32(table[6], i), LookUp32(table[7], i));
      const __m512 high =
          _mm512_mask_blend_ps(up2, LookUp32(table[8], i), LookUp32(table[9], i));
      const __mmask16 up1 = AtMost(_mm512_mask_blend_ps(up4, low, high), y[u]);
      __m512i codes = _mm512_slli_epi32(i, 3);
      codes = _mm512_mask_add_epi32(codes, up4, codes, _mm512_set1_epi32(4));
      codes = _mm512_mask_add_epi32(codes, up2, codes, _mm512_set1_epi32(2));
      codes = _mm512_mask_add_epi32(codes, up1, codes, _mm512_set1_epi32(1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * u),
                       _mm512_cvtepi32_epi8(codes));
    }
  }
};

// The same for a map of 16 entries: four steps over one register.
struct Search16 {
  __m512 t7, by4, by2, by1;

  __attribute__((target("avx512f"), always_inline)) explicit Search16(
      const QuantizedMoment& m) {
    t7 = _mm512_set1_ps(m.thresholds[7]);
    by4 = _mm512_load_ps(m.steps[0]);
    by2 = _mm512_load_ps(m.steps[1]);
    by1 = _mm512_load_ps(m.steps[2]);
  }

  // The codes of `x[16 * u + i] * scale` in `codes[u]` (one per 32-bit lane).
  template <int kVectors>
  __attribute__((target("avx512f"), always_inline)) void Codes(
      const float* x, __m512 scale, __m512i* codes) const {
    __m512 y[kVectors];
    for (int u = 0; u < kVectors; ++u) {
      y[u] = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * u), scale);
      codes[u] = _mm512_maskz_mov_epi32(AtMost(t7, y[u]), _mm512_set1_epi32(8));
    }
    const __m512 tables[3] = {by4, by2, by1};
    for (int j = 0; j < 3; ++j) {
      for (int u = 0; u < kVectors; ++u) {
        const __mmask16 up = AtMost(_mm512_permutexvar_ps(codes[u], tables[j]), y[u]);
        codes[u] =
            _mm512_mask_add_epi32(codes[u], up, codes[u], _mm512_set1_epi32(4 >> j));
      }
    }
  }

  template <int kVectors>
  __attribute__((target("avx512f"), always_inline)) void Run(const float* x,
                                                             __m512 scale,
                                                             uint8_t* out) const {
    __m512i codes[kVectors];
    Codes<kVectors>(x, scale, codes);
    for (int u = 0; u < kVectors; ++u) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * u),
                       _mm512_cvtepi32_epi8(codes[u]));
    }
  }

  // As `Run`, with each pair of codes packed into one byte (the first in the
  // high half) at `out[8 * u]`: a 64-bit lane holds a pair.
  template <int kVectors>
  __attribute__((target("avx512f"), always_inline)) void RunPacked(
      const float* x, __m512 scale, uint8_t* out) const {
    __m512i codes[kVectors];
    Codes<kVectors>(x, scale, codes);
    for (int u = 0; u < kVectors; ++u) {
      // (first << 4) & 0xF0 | second, in the low byte of each 64-bit lane.
      const __m512i pairs = _mm512_ternarylogic_epi64(
          _mm512_slli_epi64(codes[u], 4), _mm512_srli_epi64(codes[u], 32),
          _mm512_set1_epi64(0xF0), 0xEC);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 8 * u),
                       _mm512_cvtepi64_epi8(pairs));
    }
  }
};

// Word 2 e + 1 (top half) or 2 e (low half) of two float vectors, e < 32; byte
// 2 e of two 16-bit vectors, e < 64.
alignas(64) constexpr uint16_t kOddWords[32] = {
    1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63,
};
alignas(64) constexpr uint16_t kEvenWords[32] = {
    0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
    32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62,
};
alignas(64) constexpr uint8_t kEvenBytes[64] = {
    0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
    32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62,
    64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86, 88, 90, 92, 94,
    96, 98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126,
};

// 16-bit entry `u` (0 to 63; higher bits ignored) of a table held in two registers.
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i LookUp64(
    const __m512i* table, __m512i u) {
  return _mm512_permutex2var_epi16(table[0], u, table[1]);
}

// The 8-bit codes of 64 * kGroups elements, in one pass (no loop around it: the
// compiler keeps more in registers; AVX-512 VBMI, GFNI). A binary search over the
// top halves of the order keys (`Key16`) in 16-bit lanes, 32 to a register, counts
// the thresholds whose top half is at most `y`'s: the code, or one more where the
// last one counted shares `y`'s top half and its low half is above `y`'s (at most
// one threshold per top half: `StepTables`). That threshold is the last step's
// that went up, so its halves come from the step tables: no look-up by code.
// Until code bit 2 is known the code so far over 8 (`w`) has five bits, so those
// steps look up one register (`vpermw`, no copy). The code's bits are gathered
// out of order (bits 7 to 3 low, where the look-ups read them) and put in order
// by one GFNI affine map per 64 codes.
// kClamp: `y` clamped to [-1.5, 1.5] (NaN: -1.5, code 0), which keeps every
// comparison with the thresholds. Without it `y` must be a number in [-1.5, 1.5]
// already (`Store`: a block with a finite absmax).
template <int kGroups, bool kClamp>
__attribute__((target("avx512f,avx512bw,avx512vbmi,gfni"), noinline)) void CodesVbmiRun(
    const QuantizedMoment& m, const float* x, float inverse, uint8_t* out) {
  __m512i level[5], final[8][2];
  for (int j = 0; j < 5; ++j) level[j] = _mm512_load_si512(m.step_words[j]);
  for (int j = 0; j < 8; ++j) {
    final[j][0] = _mm512_load_si512(m.finals[j]);
    final[j][1] = _mm512_load_si512(m.finals[j] + 32);
  }
  const __m512i tops = _mm512_load_si512(kOddWords);
  const __m512i lows = _mm512_load_si512(kEvenWords);
  const __m512i pack = _mm512_load_si512(kEvenBytes);
  const __m512 scale = _mm512_set1_ps(inverse);
  const __m512 lowest = _mm512_set1_ps(-1.5f), highest = _mm512_set1_ps(1.5f);
  const __m512i flip = _mm512_set1_epi16(0x7FFF);
  const __m512i middle = _mm512_set1_epi16(Key16(m.thresholds[127]));
  // `shuffled` (below) to the code: bit i of the code is bit source[i] of
  // `shuffled`, picked by row 7 - i of the matrix.
  constexpr int source[8] = {7, 6, 5, 0, 1, 2, 3, 4};
  int64_t rows = 0;
  for (int bit = 0; bit < 8; ++bit) {
    rows |= int64_t{1} << source[bit] << (8 * (7 - bit));
  }
  const __m512i unshuffle = _mm512_set1_epi64(rows);
  constexpr int kV = 2 * kGroups;  // 32-lane vectors
  __m512i key[kV], low[kV], w[kV];
  for (int v = 0; v < kV; ++v) {
    __m512i half[2];
    for (int h = 0; h < 2; ++h) {
      __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + 32 * v + 16 * h), scale);
      // `max` gives its second operand where the first is NaN.
      if (kClamp) y = _mm512_min_ps(_mm512_max_ps(y, lowest), highest);
      half[h] = _mm512_castps_si512(y);
    }
    const __m512i top = _mm512_permutex2var_epi16(half[0], tops, half[1]);
    const __m512i negative = _mm512_srai_epi16(top, 15);
    key[v] = _mm512_ternarylogic_epi32(top, negative, flip, 0x78);  // a ^ (b & c)
    low[v] = _mm512_xor_si512(_mm512_permutex2var_epi16(half[0], lows, half[1]),
                              negative);
    w[v] = _mm512_maskz_mov_epi16(_mm512_cmple_epi16_mask(middle, key[v]),
                                  _mm512_set1_epi16(16));
  }
  for (int j = 0; j < 4; ++j) {
    for (int v = 0; v < kV; ++v) {
      const __m512i t = _mm512_permutexvar_epi16(w[v], level[j]);
      const __mmask32 up = _mm512_cmple_epi16_mask(t, key[v]);
      w[v] = _mm512_mask_add_epi16(w[v], up, w[v], _mm512_set1_epi16(8 >> j));
    }
  }
  __m512i shuffled[kV];
  __mmask32 overs[kV];
  for (int v = 0; v < kV; ++v) {
    const __mmask32 up4 =
        _mm512_cmple_epi16_mask(_mm512_permutexvar_epi16(w[v], level[4]), key[v]);
    const __m512i u = _mm512_mask_add_epi16(w[v], up4, w[v], _mm512_set1_epi16(32));
    const __m512i t2 = LookUp64(final[0], u);
    const __mmask32 up2 = _mm512_cmple_epi16_mask(t2, key[v]);
    const __m512i t1 =
        _mm512_mask_blend_epi16(up2, LookUp64(final[1], u), LookUp64(final[2], u));
    const __mmask32 up1 = _mm512_cmple_epi16_mask(t1, key[v]);
    // The last threshold counted: t[4 q + 2 up2] (up1), t[4 q + 1] (up2), else
    // t[4 q - 1].
    __m512i top = _mm512_mask_blend_epi16(up2, LookUp64(final[3], u), t2);
    top = _mm512_mask_blend_epi16(up1, top, t1);
    __m512i bottom =
        _mm512_mask_blend_epi16(up2, LookUp64(final[4], u), LookUp64(final[5], u));
    bottom = _mm512_mask_mov_epi16(
        bottom, up1,
        _mm512_mask_blend_epi16(up2, LookUp64(final[6], u), LookUp64(final[7], u)));
    const __mmask32 over = _mm512_mask_cmpgt_epu16_mask(
        _mm512_cmpeq_epi16_mask(top, key[v]), bottom, low[v]);
    // The code so far over 8, then code bits 2, 1, 0 (before the correction).
    const __m512i c = _mm512_mask_add_epi16(u, up2, u, _mm512_set1_epi16(64));
    shuffled[v] = _mm512_mask_add_epi16(c, up1, c, _mm512_set1_epi16(128));
    overs[v] = over;
  }
  for (int g = 0; g < kGroups; ++g) {
    __m512i codes =
        _mm512_permutex2var_epi8(shuffled[2 * g], pack, shuffled[2 * g + 1]);
    codes = _mm512_gf2p8affine_epi64_epi8(codes, unshuffle, 0);
    const __mmask64 over = _mm512_kunpackd(overs[2 * g + 1], overs[2 * g]);
    codes = _mm512_mask_sub_epi8(codes, over, codes, _mm512_set1_epi8(1));
    _mm512_storeu_si512(out + 64 * g, codes);
  }
}
// `out[i] = code(x[i] * inverse)` for i < n: 256, then 64 at a time.
template <bool kClamp>
void CodesVbmi(const QuantizedMoment& m, const Search& code, const float* x, int64_t n,
               float inverse, uint8_t* out) {
  int64_t i = 0;
  for (; i + 256 <= n; i += 256) CodesVbmiRun<4, kClamp>(m, x + i, inverse, out + i);
  for (; i + 64 <= n; i += 64) CodesVbmiRun<1, kClamp>(m, x + i, inverse, out + i);
  for (; i < n; ++i) out[i] = code(x[i] * inverse);
}

// `Store`'s packed 4-bit codes of `x[i] * inverse` for even n, by `Search16`.
__attribute__((target("avx512f"))) void PackedCodesAvx512(const QuantizedMoment& m,
                                                         const Search& code,
                                                         const float* x, int64_t n,
                                                         float inverse, uint8_t* out) {
  const Search16 search(m);
  const __m512 scale = _mm512_set1_ps(inverse);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) search.RunPacked<4>(x + i, scale, out + i / 2);
  for (; i + 16 <= n; i += 16) search.RunPacked<1>(x + i, scale, out + i / 2);
  for (; i + 1 < n; i += 2) {
    out[i / 2] = static_cast<uint8_t>((code(x[i] * inverse) << 4) |
                                      code(x[i + 1] * inverse));
  }
}

// `out[i] = code(x[i] * inverse)` for i < n, by `Search256` or `Search16`.
template <typename Searcher, int kVectors>
__attribute__((target("avx512f"))) void CodesAvx512(const QuantizedMoment& m,
                                                   const Search& code, const float* x,
                                                   int64_t n, float inverse,
                                                   uint8_t* out) {
  const Searcher search(m);
  const __m512 scale = _mm512_set1_ps(inverse);
  int64_t i = 0;
  for (; i + 16 * kVectors <= n; i += 16 * kVectors) {
    search.template Run<kVectors>(x + i, scale, out + i);
  }
  for (; i + 16 <= n; i += 16) search.template Run<1>(x + i, scale, out + i);
  for (; i < n; ++i) out[i] = code(x[i] * inverse);
}

// `LargestAvx2`, sixteen at a time.
__attribute__((target("avx512f"))) int32_t LargestAvx512(const float* x, int64_t n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = _mm512_max_epi32(a, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
    b = _mm512_max_epi32(b,
                         _mm512_and_si512(_mm512_loadu_si512(x + i + 16), magnitude));
  }
  int32_t result = _mm512_reduce_max_epi32(_mm512_max_epi32(a, b));
  return LargestFrom(x, i, n, result);
}

const bool kAvx2 = __builtin_cpu_supports("avx2");
const bool kAvx512 = __builtin_cpu_supports("avx512f");
const bool kVbmi = __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vbmi");
// `CodesVbmi` also puts its codes' bits in order by a GFNI affine map.
const bool kVbmiGfni = kVbmi && __builtin_cpu_supports("gfni");
#else
const bool kAvx2 = false;
const bool kAvx512 = false;
const bool kVbmi = false;
const bool kVbmiGfni = false;
#endif

// The largest |x[i]| as its bits (a NaN's are larger than any number's).
int32_t Largest(const float* x, int64_t n) {
#if defined(__x86_64__)
  if (kAvx512) return LargestAvx512(x, n);
  if (kAvx2) return LargestAvx2(x, n);
#endif
  return LargestFrom(x, 0, n, 0);
}

// `out[i] = code(x[i] * inverse)` for i < n. `bounded`: every `x[i] * inverse` is
// a number in [-1.5, 1.5] (`Store`).
void Encode(const QuantizedMoment& m, const Search& code, const float* x, int64_t n,
            float inverse, uint8_t* out, bool bounded = false) {
#if defined(__x86_64__)
  if (kVbmiGfni && m.levels == 256 && m.word_search) {
    if (bounded) return CodesVbmi<false>(m, code, x, n, inverse, out);
    return CodesVbmi<true>(m, code, x, n, inverse, out);
  }
  if (kAvx512 && m.levels == 256) {
    return CodesAvx512<Search256, 8>(m, code, x, n, inverse, out);
  }
  if (kAvx512) return CodesAvx512<Search16, 4>(m, code, x, n, inverse, out);
  if (kAvx2) return CodesAvx2(code, x, n, inverse, out);
#endif
  Codes(code, x, n, inverse, out);
}

// `out[i] = m.map[codes[i]] * scale` for i < n (an 8-bit moment).
void Decode(const QuantizedMoment& m, const uint8_t* codes, int64_t n, float scale,
            float* out) {
#if defined(__x86_64__)
  if (kVbmi) return DecodeVbmi(m.planes, m.map, codes, n, scale, out);
  if (kAvx2) return DecodeAvx2(m.map, codes, n, scale, out);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = m.map[codes[i]] * scale;
}

// The values of moment `m` for the leaf's elements [begin, begin + valid) (begin
// is a multiple of its block size), into `out`.
void Load(const QuantizedMoment& m, float* out, int64_t begin, int64_t valid) {
  const float* map = m.map;
  const int64_t block = m.block;
  for (int64_t start = 0; start < valid; start += block) {
    const float scale = m.absmax_in[(begin + start) / block];
    const int64_t count = std::min(block, valid - start);
    float* x = out + start;
    if (!m.packed) {
      Decode(m, m.codes_in + begin + start, count, scale, x);
    } else {
      const uint8_t* codes = m.codes_in + (begin + start) / 2;
#if defined(__x86_64__)
      if (kAvx512 || kAvx2) {
        const int64_t even = count & ~int64_t{1};
        if (kAvx512) {
          DecodePackedAvx512(map, codes, even, scale, x);
        } else {
          DecodePackedAvx2(map, codes, even, scale, x);
        }
        if (count % 2) x[count - 1] = map[codes[(count - 1) / 2] >> 4] * scale;
        continue;
      }
#endif
      for (int64_t i = 0; i + 1 < count; i += 2) {
        const uint8_t byte = codes[i / 2];
        x[i] = map[byte >> 4] * scale;
        x[i + 1] = map[byte & 0xF] * scale;
      }
      if (count % 2) x[count - 1] = map[codes[(count - 1) / 2] >> 4] * scale;
    }
  }
}

// Stores the absmax of each block of moment `m`'s new values for the leaf's
// elements [begin, begin + valid) (the chunk's `values`; the rest of the chunk's
// last block is the zero padding of the leaf's last block), and its reciprocal in
// `inverses` for `Store`. (All blocks of a chunk first, so that their reductions
// and divisions overlap.) A value that is not finite is first set to 0 in
// `values`, as `_storage.quantize` stores it (its comment says why).
void Scale(const QuantizedMoment& m, float* values, int64_t begin, int64_t valid,
           int64_t chunk, float* inverses) {
  const int64_t block = m.block;
  for (int64_t start = 0; start < chunk; start += block) {
    const int64_t b = (begin + start) / block;
    if (b >= m.n_blocks) break;
    const int64_t real = std::min<int64_t>(block, valid - start);
    // The largest |x| as its bits: at least an infinity's if the block holds a
    // value that is not finite, which is rare, so only then a second pass.
    int32_t largest = Largest(values + start, real);
    if (largest >= 0x7F800000) {
      float* x = values + start;
      for (int64_t i = 0; i < real; ++i) x[i] = std::isfinite(x[i]) ? x[i] : 0.0f;
      largest = Largest(x, real);
    }
    float amax;
    std::memcpy(&amax, &largest, sizeof amax);
    amax = NanMax(amax, 1e-12f);
    m.absmax_out[b] = amax;
    inverses[start / block] = 1.0f / amax;
  }
}

// The codes of the zeros padding a leaf's last block.
__attribute__((noinline)) void Pad(const Search& code, float inverse, uint8_t* out,
                                   int64_t n) {
  const uint8_t pad = code(0.0f * inverse);
  for (int64_t i = 0; i < n; ++i) out[i] = pad;
}

// `codes` (n even, each below 16) two to a byte, the first in the high half.
__attribute__((noinline)) void PackPairs(const uint8_t* codes, int64_t n,
                                         uint8_t* out) {
  int64_t i = 0;
#if defined(__x86_64__)
  // Sixteen codes to eight bytes.
  const __m128i low_byte = _mm_set1_epi16(0xFF);
  for (; i + 16 <= n; i += 16) {
    const __m128i pairs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __m128i first = _mm_slli_epi16(_mm_and_si128(pairs, low_byte), 4);
    const __m128i bytes = _mm_or_si128(first, _mm_srli_epi16(pairs, 8));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 2),
                     _mm_packus_epi16(bytes, bytes));
  }
#endif
  for (; i < n; i += 2) {
    out[i / 2] = static_cast<uint8_t>((codes[i] << 4) | codes[i + 1]);
  }
}

// Stores the codes of those values, by `Scale`'s `inverses`.
void Store(const QuantizedMoment& m, const float* values, int64_t begin,
           int64_t valid, int64_t chunk, const float* inverses, uint8_t* scratch) {
  const Search code(m);
  const int64_t block = m.block;
  for (int64_t start = 0; start < chunk; start += block) {
    const int64_t b = (begin + start) / block;
    if (b >= m.n_blocks) break;
    const int64_t real = std::min<int64_t>(block, valid - start);
    const float* x = values + start;
    const float inverse = inverses[start / block];
#if defined(__x86_64__)
    if (m.packed && kAvx512 && real == block) {
      PackedCodesAvx512(m, code, x, block, inverse, m.codes_out + b * (block / 2));
      continue;
    }
#endif
    uint8_t* codes = m.packed ? scratch : m.codes_out + b * block;
    // A finite absmax a is the largest |x| of the block, or 1e-12 if larger, so
    // every x is a number with |x| <= a; inverse = RN(1 / a) <= (1 + 2^-24) / a,
    // so |x * inverse| <= 1 + 2^-24, and y = RN(x * inverse) is a number of at
    // most 1 + 2^-23 in magnitude: no clamp needed.
    Encode(m, code, x, real, inverse, codes, std::isfinite(m.absmax_out[b]));
    if (real < block) Pad(code, inverse, codes + real, block - real);
    if (m.packed) PackPairs(codes, block, m.codes_out + b * (block / 2));
  }
}

// `m.planes` from the 256 entries of `m.map`, for `DecodeVbmi`.
void SetPlanes(QuantizedMoment& m) {
  for (int c = 0; c < 256; ++c) {
    uint32_t bits;
    std::memcpy(&bits, m.map + c, sizeof bits);
    for (int k = 0; k < 4; ++k) m.planes[k][c] = (bits >> (8 * k)) & 0xFF;
  }
}

// float16's bits as float32 (exact).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0) {
    // Subnormal (or zero): mantissa * 2^-24, exact in float32; the sign by bits.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// float32 rounded to nearest (ties to even) float16, as XLA's conversion, by
// integer arithmetic (the floating-point mode does not touch it).
inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) return sign | (x > 0x7F800000 ? 0x7E00 : 0x7C00);
  if (x >= 0x477FF000) return sign | 0x7C00;  // from 65520 on: infinity
  if (x <= 0x33000000) return sign;           // up to 2^-25: zero (ties to even)
  const uint32_t exponent = x >> 23;
  if (exponent < 113) {  // a float16 subnormal: units of 2^-24
    const uint32_t mantissa = (x & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - exponent;
    uint32_t h = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((exponent - 112) << 10) | ((x >> 13) & 0x3FF);
  const uint32_t rest = x & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry: exact
  return static_cast<uint16_t>(sign | h);
}

// bf16's bits as float32 (exact).
inline float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// float32 rounded to nearest (ties to even) bf16, as XLA's conversion: a NaN
// becomes the quiet NaN of its sign.
inline uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t nan = ((x >> 16) & 0x8000) | 0x7FC0;
  const uint32_t rounded = (x + 0x7FFF + ((x >> 16) & 1)) >> 16;
  return static_cast<uint16_t>((x & 0x7FFFFFFF) > 0x7F800000 ? nan : rounded);
}

// 2^k for an integer k in float32's normal range (`_storage._exp2`), exactly.
inline float Exp2(int32_t k) {
  const int32_t bits = (k + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// `_storage.log2_half_ulp` of a bf16 value: log2 of half its spacing.
inline int32_t Log2HalfUlp(uint16_t b) {
  const int32_t exponent = (b & 0x7FFF) >> 7;
  return (exponent == 0 ? 1 - 127 - 7 : exponent - 134) - 1;
}

// `_storage._times_exp2`: x * 2^k in two factors (the first 2^floor(k / 2): an
// arithmetic shift floors, as XLA's `floor(k / 2.0)` of the integer k).
inline float TimesExp2(float x, int32_t k) {
  const int32_t half = k >> 1;
  return (x * Exp2(half)) * Exp2(k - half);
}

// floor(y) of a number |y| < 2^31, by truncation (no call, so loops vectorize).
inline int32_t Floor(float y) {
  const int32_t t = static_cast<int32_t>(y);
  return t - (y < static_cast<float>(t) ? 1 : 0);
}

// XLA's clamp of a number (not NaN).
inline float Clamp(float x, float low, float high) {
  return std::min(std::max(x, low), high);
}

// Whether a float32 is a number and finite, from its bits.
inline bool Finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7F800000) != 0x7F800000;
}

// The loops below are written without calls or branches, so that the compiler
// vectorizes them; each is built twice, for AVX2 and for any x86-64 (or other
// CPU), and `kAvx2` picks one at run time. Their float operations are the same.
#if defined(__x86_64__)
#define EQXOPT_CLONES(name, params, args)                               \
  __attribute__((target("avx2"))) void name##Avx2 params {              \
    name##Body args;                                                    \
  }                                                                     \
  void name params {                                                    \
    if (kAvx2) return name##Avx2 args;                                  \
    name##Body args;                                                    \
  }
#else
#define EQXOPT_CLONES(name, params, args) \
  void name params { name##Body args; }
#endif

// `_storage.decode_residual` of n bf16 values (bits) and their residuals.
__attribute__((always_inline)) inline void DecodeResidualsBody(
    const uint16_t* value, const int8_t* residual, int64_t n, float* out) {
  constexpr float kUnit = 1.0f / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float scaled = static_cast<float>(residual[i]) * kUnit;
    out[i] = Bf16ToFloat(value[i]) + TimesExp2(scaled, Log2HalfUlp(value[i]));
  }
}
EQXOPT_CLONES(DecodeResiduals,
              (const uint16_t* value, const int8_t* residual, int64_t n, float* out),
              (value, residual, n, out))

// `_storage.encode_bf16_residual` of n float32 values: the bf16 rounding (bits)
// and the residual of what it lost, rounded to nearest (0 where it is not a
// number: an infinite or NaN value).
__attribute__((always_inline)) inline void EncodeResidualsBody(
    const float* x, int64_t n, uint16_t* value, int8_t* residual) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t stored = FloatToBf16(x[i]);
    const float error = x[i] - Bf16ToFloat(stored);
    const float scaled = TimesExp2(error, -Log2HalfUlp(stored)) * 127.0f;
    // Not a number: 0.5 below, whose floor is the residual 0.
    const float y = Clamp(scaled == scaled ? scaled : 0.0f, -127.0f, 127.0f) + 0.5f;
    value[i] = stored;
    residual[i] = static_cast<int8_t>(Floor(y));
  }
}
EQXOPT_CLONES(EncodeResiduals,
              (const float* x, int64_t n, uint16_t* value, int8_t* residual),
              (x, n, value, residual))

// A companded group's values as `_storage._compand` takes them: not finite ones
// set to 0, and for the unsigned map the square roots (of values at least 0).
__attribute__((always_inline)) inline void CompandInputsBody(float* x, int64_t n,
                                                             bool roots) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = Finite(x[i]) ? x[i] : 0.0f;
    x[i] = roots ? std::sqrt(std::max(v, 0.0f)) : v;
  }
}
EQXOPT_CLONES(CompandInputs, (float* x, int64_t n, bool roots), (x, n, roots))

// The codes of companded (finite) values, each over its group's divisor.
__attribute__((always_inline)) inline void CompandCodesBody(const float* x, int64_t n,
                                                            const float* divisors,
                                                            bool signed_map,
                                                            uint8_t* codes) {
  if (signed_map) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = Clamp(x[i] / divisors[i], -1.0f, 1.0f);
      const float companded = (2.0f * v) / (1.0f + std::fabs(v));
      const float y = Clamp(companded * 127.0f, -127.0f, 127.0f) + 0.5f;
      codes[i] = static_cast<uint8_t>(static_cast<int8_t>(Floor(y)));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float v = Clamp(x[i] / divisors[i], -1.0f, 1.0f);
      const float y = Clamp(v * 255.0f, 0.0f, 255.0f) + 0.5f;
      codes[i] = static_cast<uint8_t>(Floor(y));
    }
  }
}
EQXOPT_CLONES(CompandCodes,
              (const float* x, int64_t n, const float* divisors, bool signed_map,
               uint8_t* codes),
              (x, n, divisors, signed_map, codes))

// `root * root` of n values in place (the unsigned map stores square roots).
__attribute__((always_inline)) inline void SquareBody(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * x[i];
}
EQXOPT_CLONES(Square, (float* x, int64_t n), (x, n))

// The values of a companded moment for the leaf's elements [begin, begin +
// valid) (begin a multiple of its group size), into `out`: `table[code] *
// scale` (as an 8-bit map's, `Decode`), squared for the unsigned map
// (`QuantizedArray.dequantize`).
void LoadCompanded(const QuantizedMoment& m, float* out, int64_t begin,
                   int64_t valid) {
  for (int64_t start = 0; start < valid; start += m.block) {
    const float scale = HalfToFloat(m.scales_in[(begin + start) / m.block]);
    const int64_t count = std::min(m.block, valid - start);
    Decode(m, m.codes_in + begin + start, count, scale, out + start);
  }
  if (!m.signed_map) Square(out, valid);
}

// Stores the chunk's new `values` of a companded moment (`_storage._compand`,
// after `quantize` sets values that are not finite to 0): per group, its
// absmax (of the square roots, unsigned), the float16 scale, and each value
// divided by the scale (65504 where the absmax would round to float16's
// infinity), clipped, companded (signed) and rounded to its code. The rest of
// the leaf's last group is its zero padding (code 0 in both maps).
void StoreCompanded(const QuantizedMoment& m, float* values, int64_t begin,
                    int64_t valid, int64_t chunk, float* divisors) {
  const int64_t block = m.block;
  CompandInputs(values, valid, !m.signed_map);
  // Each group's scale, and its divisor for each of its elements, then every code
  // of the chunk in one pass (groups are short: a pass per group would be
  // mostly its loop's set-up).
  int64_t end = 0;
  for (int64_t start = 0; start < chunk; start += block) {
    const int64_t b = (begin + start) / block;
    if (b >= m.n_blocks) break;
    const int64_t real = std::min<int64_t>(block, valid - start);
    // The largest |x| as its bits (x is finite): XLA's maximum of the group.
    const int32_t largest = Largest(values + start, real);
    float amax;
    std::memcpy(&amax, &largest, sizeof amax);
    amax = std::max(amax, 1e-12f);
    const float divisor = amax >= 65520.0f ? 65504.0f : amax;
    m.scales_out[b] = FloatToHalf(divisor);
    std::fill(divisors + start, divisors + start + block, divisor);
    // The rest of the leaf's last group: its zero padding (code 0 in both maps).
    std::fill(values + start + real, values + start + block, 0.0f);
    end = start + block;
  }
  CompandCodes(values, end, divisors, m.signed_map, m.codes_out + begin);
}

// The values of an error-corrected moment for the leaf's elements [begin, begin
// + n), into `out` (`_storage.decode_residual`).
void LoadErrorCorrected(const QuantizedMoment& m, float* out, int64_t begin,
                        int64_t n) {
  DecodeResiduals(m.bf16_in + begin, m.residual_in + begin, n, out);
}

// Stores `values` (n of them, from element `begin`) as bf16 and the residual
// of what that rounding lost (`encode_bf16_residual`).
void StoreErrorCorrected(const QuantizedMoment& m, const float* values,
                         int64_t begin, int64_t n) {
  EncodeResiduals(values, n, m.bf16_out + begin, m.residual_out + begin);
}

// The fewest elements the handler walks a leaf in at a time.
constexpr int64_t kLeastChunk = 512;

ffi::Error Quantized(ffi::Buffer<ffi::F32> scalars, ffi::RemainingArgs args,
                     ffi::RemainingRets rets, int64_t kernel, int64_t n_moments) {
  KernelFn fn = lookup(kernel);
  if (fn == nullptr) return NotLoaded("quantized-state");
  auto bad = [](const char* what) {
    return ffi::Error::InvalidArgument(std::string("eqxopt: quantized step: ") + what);
  };
  if (n_moments < 0 || n_moments > 8 || args.size() < 2 ||
      static_cast<int64_t>(rets.size()) < 1 + n_moments) {
    return bad("argument counts do not match");
  }
  auto arg = [&](size_t i) { return args.get<ffi::AnyBuffer>(i); };
  auto ret = [&](size_t i) { return rets.get<ffi::AnyBuffer>(i); };
  auto g = arg(0), p = arg(1);
  auto out0 = ret(0);
  if (!g.has_value() || !p.has_value() || !out0.has_value() ||
      g->element_type() != ffi::F32 || p->element_type() != ffi::F32 ||
      (*out0)->element_type() != ffi::F32) {
    return bad("g, p and the first result must be float32");
  }
  const int64_t n = static_cast<int64_t>(g->element_count());
  if (static_cast<int64_t>(p->element_count()) != n ||
      static_cast<int64_t>((*out0)->element_count()) != n) {
    return bad("g, p and the first result differ in size");
  }
  std::vector<QuantizedMoment> moments(n_moments);
  size_t a = 2, r = 1;
  // Block-wise moments, and moments stored in any form but float32.
  int64_t chunk = 1, n_quantized = 0, n_stored = 0;
  for (int64_t k = 0; k < n_moments; ++k) {
    QuantizedMoment& m = moments[k];
    auto first = arg(a);
    if (!first.has_value()) return bad("missing moment");
    if (first->element_type() == ffi::F32) {
      auto out = ret(r);
      if (!out.has_value() || (*out)->element_type() != ffi::F32 ||
          static_cast<int64_t>(first->element_count()) != n ||
          static_cast<int64_t>((*out)->element_count()) != n) {
        return bad("a float32 moment must match the leaf");
      }
      m.values_in = static_cast<const float*>(first->untyped_data());
      m.values_out = static_cast<float*>((*out)->untyped_data());
      a += 1;
      r += 1;
      continue;
    }
    if (first->element_type() == ffi::BF16) {
      // Error-corrected: the bf16 values, then the int8 residuals.
      auto residual = arg(a + 1);
      auto value_out = ret(r), residual_out = ret(r + 1);
      if (!residual.has_value() || !value_out.has_value() ||
          !residual_out.has_value() || residual->element_type() != ffi::S8 ||
          (*value_out)->element_type() != ffi::BF16 ||
          (*residual_out)->element_type() != ffi::S8 ||
          static_cast<int64_t>(first->element_count()) != n ||
          static_cast<int64_t>(residual->element_count()) != n ||
          static_cast<int64_t>((*value_out)->element_count()) != n ||
          static_cast<int64_t>((*residual_out)->element_count()) != n) {
        return bad("an error-corrected moment's buffers do not match the leaf");
      }
      m.kind = Kind::kErrorCorrected;
      m.bf16_in = static_cast<const uint16_t*>(first->untyped_data());
      m.residual_in = static_cast<const int8_t*>(residual->untyped_data());
      m.bf16_out = static_cast<uint16_t*>((*value_out)->untyped_data());
      m.residual_out = static_cast<int8_t*>((*residual_out)->untyped_data());
      ++n_stored;
      a += 2;
      r += 2;
      continue;
    }
    auto scales = arg(a + 1);
    if (scales.has_value() && scales->element_type() == ffi::F16) {
      // Companded: codes, float16 scales, the table and the map's sign.
      auto table = arg(a + 2), sign = arg(a + 3);
      auto codes_out = ret(r), scales_out = ret(r + 1);
      if (!table.has_value() || !sign.has_value() || !codes_out.has_value() ||
          !scales_out.has_value() || first->element_type() != ffi::U8 ||
          first->dimensions().size() != 2 || table->element_type() != ffi::F32 ||
          table->element_count() != 256 || sign->element_type() != ffi::S32 ||
          sign->element_count() != 1 || (*codes_out)->element_type() != ffi::U8 ||
          (*scales_out)->element_type() != ffi::F16) {
        return bad("a companded moment's buffers have the wrong types");
      }
      m.kind = Kind::kCompanded;
      m.n_blocks = first->dimensions()[0];
      m.block = first->dimensions()[1];
      if (m.block <= 0 || m.n_blocks != (n + m.block - 1) / m.block ||
          static_cast<int64_t>(scales->element_count()) != m.n_blocks ||
          (*codes_out)->element_count() != first->element_count() ||
          static_cast<int64_t>((*scales_out)->element_count()) != m.n_blocks) {
        return bad("a companded moment's buffers have the wrong sizes");
      }
      m.codes_in = static_cast<const uint8_t*>(first->untyped_data());
      m.scales_in = static_cast<const uint16_t*>(scales->untyped_data());
      m.table = static_cast<const float*>(table->untyped_data());
      m.map = m.table;  // read as an 8-bit map's (`Decode`)
      SetPlanes(m);
      m.signed_map = *static_cast<const int32_t*>(sign->untyped_data()) != 0;
      m.codes_out = static_cast<uint8_t*>((*codes_out)->untyped_data());
      m.scales_out = static_cast<uint16_t*>((*scales_out)->untyped_data());
      chunk = std::lcm(chunk, m.block);
      if (chunk > (1 << 20)) return bad("the moments' block sizes are too far apart");
      ++n_stored;
      a += 4;
      r += 2;
      continue;
    }
    auto absmax = arg(a + 1), map = arg(a + 2), buckets = arg(a + 3),
         geometry = arg(a + 4), thresholds = arg(a + 5);
    auto codes_out = ret(r), absmax_out = ret(r + 1);
    if (!absmax.has_value() || !map.has_value() || !buckets.has_value() ||
        !geometry.has_value() || !thresholds.has_value() || !codes_out.has_value() ||
        !absmax_out.has_value() || geometry->element_type() != ffi::S32 ||
        thresholds->element_type() != ffi::F32 ||
        geometry->element_count() != 2 ||
        first->element_type() != ffi::U8 || absmax->element_type() != ffi::F32 ||
        map->element_type() != ffi::F32 ||
        buckets->element_type() != ffi::S32 ||
        (*codes_out)->element_type() != ffi::U8 ||
        (*absmax_out)->element_type() != ffi::F32 || first->dimensions().size() != 2) {
      return bad("a quantized moment's buffers have the wrong types");
    }
    m.kind = Kind::kBlockwise;
    m.quantized = true;
    m.levels = static_cast<int64_t>(map->element_count());
    m.packed = m.levels == 16;
    m.n_blocks = first->dimensions()[0];
    m.block = first->dimensions()[1] * (m.packed ? 2 : 1);
    m.n_buckets = static_cast<int64_t>(buckets->element_count());
    const int32_t* shift_low = static_cast<const int32_t*>(geometry->untyped_data());
    m.shift = shift_low[0];
    m.low = shift_low[1];
    if ((m.levels != 256 && m.levels != 16) ||
        m.block <= 0 || m.n_blocks != (n + m.block - 1) / m.block ||
        static_cast<int64_t>(absmax->element_count()) != m.n_blocks ||
        static_cast<int64_t>(thresholds->element_count()) != m.levels ||
        (*codes_out)->element_count() != first->element_count() ||
        static_cast<int64_t>((*absmax_out)->element_count()) != m.n_blocks ||
        m.n_buckets < 2 || m.n_buckets % 2 != 0 || m.shift < 0 || m.shift > 23 ||
        m.low < 0 || (int64_t{m.low} << m.shift) >= (int64_t{1} << 31) ||
        ((m.n_buckets / 2) << m.shift) >= (int64_t{1} << 31)) {
      return bad("a quantized moment's buffers have the wrong sizes");
    }
    m.codes_in = static_cast<const uint8_t*>(first->untyped_data());
    m.absmax_in = static_cast<const float*>(absmax->untyped_data());
    m.map = static_cast<const float*>(map->untyped_data());
    m.buckets = static_cast<const int32_t*>(buckets->untyped_data());
    m.thresholds = static_cast<const float*>(thresholds->untyped_data());
    StepTables(m);
    if (!m.packed) SetPlanes(m);
    m.codes_out = static_cast<uint8_t*>((*codes_out)->untyped_data());
    m.absmax_out = static_cast<float*>((*absmax_out)->untyped_data());
    chunk = std::lcm(chunk, m.block);
    if (chunk > (1 << 20)) return bad("the moments' block sizes are too far apart");
    ++n_quantized;
    ++n_stored;
    a += 6;
    r += 2;
  }
  if (a != args.size() || r != rets.size()) return bad("argument counts do not match");
  // Whole groups per chunk, and enough elements that the rule's call is not per
  // element (error-corrected moments have no groups).
  if (chunk < kLeastChunk) chunk *= (kLeastChunk + chunk - 1) / chunk;

  const float* s = scalars.typed_data();
  const float* g_data = static_cast<const float*>(g->untyped_data());
  const float* p_data = static_cast<const float*>(p->untyped_data());
  float* out_data = static_cast<float*>((*out0)->untyped_data());
  const int64_t n_chunks = (n + chunk - 1) / chunk;

  // Chunks [first, last) on one thread, with its own buffers.
  auto run = [&](int64_t first, int64_t last) {
    std::vector<float> buffer(2 * n_stored * chunk);
    std::vector<uint8_t> scratch(chunk);
    std::vector<float> inverses(n_quantized * chunk);
    std::vector<float> divisors(chunk);
    std::vector<const float*> in(2 + n_moments);
    std::vector<float*> out(1 + n_moments);
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * chunk, valid = std::min(chunk, n - begin);
      in[0] = g_data + begin;
      in[1] = p_data + begin;
      out[0] = out_data + begin;
      int64_t q = 0;
      for (int64_t k = 0; k < n_moments; ++k) {
        const QuantizedMoment& m = moments[k];
        if (m.kind == Kind::kFloat32) {
          in[2 + k] = m.values_in + begin;
          out[1 + k] = m.values_out + begin;
          continue;
        }
        float* old = buffer.data() + (2 * q) * chunk;
        if (m.kind == Kind::kBlockwise) Load(m, old, begin, valid);
        if (m.kind == Kind::kCompanded) LoadCompanded(m, old, begin, valid);
        if (m.kind == Kind::kErrorCorrected) LoadErrorCorrected(m, old, begin, valid);
        in[2 + k] = old;
        out[1 + k] = old + chunk;
        ++q;
      }
      fn(in.data(), out.data(), s, valid);
      for (int64_t k = 0, q = 0; k < n_moments; ++k) {
        if (moments[k].quantized) {
          Scale(moments[k], out[1 + k], begin, valid, chunk, &inverses[chunk * q++]);
        }
      }
      for (int64_t k = 0, q = 0; k < n_moments; ++k) {
        if (moments[k].quantized) {
          Store(moments[k], out[1 + k], begin, valid, chunk, &inverses[chunk * q++],
                scratch.data());
        }
      }
      for (int64_t k = 0; k < n_moments; ++k) {
        if (moments[k].kind == Kind::kCompanded) {
          StoreCompanded(moments[k], out[1 + k], begin, valid, chunk,
                         divisors.data());
        } else if (moments[k].kind == Kind::kErrorCorrected) {
          StoreErrorCorrected(moments[k], out[1 + k], begin, valid);
        }
      }
    }
  };

  const int64_t n_tasks = TaskCount(n, n_chunks);
  const int64_t per = (n_chunks + n_tasks - 1) / n_tasks;
  RunTasks(n_tasks, [&](int64_t task) {
    run(std::min(n_chunks, task * per), std::min(n_chunks, (task + 1) * per));
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqxoptQuantized, Quantized, StepBinding("n_moments"));
