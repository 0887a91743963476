#include "level_gather.h"

#include <array>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LAZYMEDIA_LEVEL_VBMI 1
#endif

namespace lazymedia {

template <typename E>
std::vector<uint8_t> level_planes(const E* tables, size_t groups, size_t length) {
  constexpr size_t kPlanes = sizeof(E);
  std::vector<uint8_t> planes(groups * kPlanes * 256, 0);
  for (size_t g = 0; g < groups; ++g) {
    uint8_t* group = planes.data() + g * kPlanes * 256;
    for (size_t c = 0; c < length && c < 256; ++c) {
      const uint64_t v = uint64_t(tables[g * length + c]);
      for (size_t p = 0; p < kPlanes; ++p) group[p * 256 + c] = uint8_t(v >> (8 * p));
    }
  }
  return planes;
}
template std::vector<uint8_t> level_planes<uint8_t>(const uint8_t*, size_t, size_t);
template std::vector<uint8_t> level_planes<uint16_t>(const uint16_t*, size_t, size_t);
template std::vector<uint8_t> level_planes<uint32_t>(const uint32_t*, size_t, size_t);

#ifdef LAZYMEDIA_LEVEL_VBMI

bool level_gather_vectorised() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
  return supported;
}

namespace {

// The order the codes are permuted into before the lookups, so that the unpack instructions
// (which interleave within 128-bit lanes) leave the elements in memory order: byte q of the
// planes becomes element order[q]. For 4-byte elements q = 16L + 4k + m lands in element
// 16k + 4L + m (store k, lane L); for 2-byte elements q = 16L + 8k + m in 32k + 8L + m.
template <size_t kPlanes>
std::array<uint8_t, 64> code_order() {
  std::array<uint8_t, 64> order{};
  constexpr size_t per_store = 64 / kPlanes, per_lane = 16 / kPlanes;
  for (size_t q = 0; q < 64; ++q) {
    const size_t lane = q / 16, store = (q % 16) / per_lane, m = q % per_lane;
    order[q] = uint8_t(per_store * store + per_lane * lane + m);
  }
  return order;
}

}  // namespace

// Compiled for AVX-512 VBMI whatever the build's flags; only called where the CPU has it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own _mm512_permutexvar_epi8
#endif

template <typename E>
bool level_gather_u8(const uint8_t* codes, size_t n, const uint8_t* planes, size_t length, E* dst) {
  static_assert(sizeof(E) == 1 || sizeof(E) == 2 || sizeof(E) == 4, "8-, 16- or 32-bit patterns");
  constexpr size_t kPlanes = sizeof(E), kPerStore = 64 / kPlanes;
  static const std::array<uint8_t, 64> order_bytes = code_order<kPlanes>();
  const __m512i order = _mm512_loadu_si512(order_bytes.data());
  __m512i low[kPlanes][2], high[kPlanes][2];  // each plane's entries 0-127 and 128-255
  for (size_t p = 0; p < kPlanes; ++p) {
    for (size_t h = 0; h < 2; ++h) {
      low[p][h] = _mm512_loadu_si512(planes + p * 256 + 64 * h);
      high[p][h] = _mm512_loadu_si512(planes + p * 256 + 128 + 64 * h);
    }
  }
  const __m512i last = _mm512_set1_epi8(char(uint8_t(length > 256 ? 255 : length - 1)));
  __mmask64 bad = 0;
  for (size_t i = 0; i < n; i += 64) {
    const size_t count = n - i < 64 ? n - i : 64;
    const __mmask64 valid = count == 64 ? ~__mmask64(0) : (__mmask64(1) << count) - 1;
    __m512i c = _mm512_maskz_loadu_epi8(valid, codes + i);
    bad |= _mm512_cmpgt_epu8_mask(c, last);
    c = _mm512_permutexvar_epi8(order, c);
    const __mmask64 top = _mm512_movepi8_mask(c);
    __m512i bytes[kPlanes];
    for (size_t p = 0; p < kPlanes; ++p) {
      bytes[p] = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(low[p][0], c, low[p][1]),
                                        _mm512_permutex2var_epi8(high[p][0], c, high[p][1]));
    }
    __m512i out[kPlanes];
    if constexpr (kPlanes == 4) {
      const __m512i lo01 = _mm512_unpacklo_epi8(bytes[0], bytes[1]), hi01 = _mm512_unpackhi_epi8(bytes[0], bytes[1]);
      const __m512i lo23 = _mm512_unpacklo_epi8(bytes[2], bytes[3]), hi23 = _mm512_unpackhi_epi8(bytes[2], bytes[3]);
      out[0] = _mm512_unpacklo_epi16(lo01, lo23);
      out[1] = _mm512_unpackhi_epi16(lo01, lo23);
      out[2] = _mm512_unpacklo_epi16(hi01, hi23);
      out[3] = _mm512_unpackhi_epi16(hi01, hi23);
    } else if constexpr (kPlanes == 2) {
      out[0] = _mm512_unpacklo_epi8(bytes[0], bytes[1]);
      out[1] = _mm512_unpackhi_epi8(bytes[0], bytes[1]);
    } else {
      out[0] = bytes[0];
    }
    for (size_t s = 0; s < kPlanes; ++s) {
      const size_t first = s * kPerStore;
      if (first >= count) break;
      E* to = dst + i + first;
      if (count - first >= kPerStore) {
        _mm512_storeu_si512(to, out[s]);
      } else if constexpr (kPlanes == 4) {
        _mm512_mask_storeu_epi32(to, __mmask16((1u << (count - first)) - 1), out[s]);
      } else if constexpr (kPlanes == 2) {
        _mm512_mask_storeu_epi16(to, __mmask32((1u << (count - first)) - 1), out[s]);
      } else {
        _mm512_mask_storeu_epi8(to, valid, out[s]);
      }
    }
  }
  return bad == 0;
}

template bool level_gather_u8<uint8_t>(const uint8_t*, size_t, const uint8_t*, size_t, uint8_t*);
template bool level_gather_u8<uint16_t>(const uint8_t*, size_t, const uint8_t*, size_t, uint16_t*);
template bool level_gather_u8<uint32_t>(const uint8_t*, size_t, const uint8_t*, size_t, uint32_t*);

namespace {

// level_encode_u32 with or without the twin, as two loops: a run-time test of the twin stayed in
// the loop and slowed the write without twins.
template <bool kTwin>
size_t encode_u32(const uint32_t* src, size_t n, const uint32_t* slots, int bits, uint8_t* codes,
                  const uint32_t* twin) {
  const __m512i factor = _mm512_set1_epi32(int(0x9E3779B1u));
  const __m512i mask = _mm512_set1_epi32(int((1u << bits) - 1));
  const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  const __m128i shift = _mm_cvtsi32_si128(32 - bits);
  const auto* pairs = reinterpret_cast<const long long*>(slots);
  for (size_t i = 0; i < n; i += 16) {
    const size_t count = n - i < 16 ? n - i : 16;
    const __mmask16 valid = count == 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
    const __m512i v = _mm512_maskz_loadu_epi32(valid, src + i);
    if constexpr (kTwin) {
      // Called a half at a time, in strides, the loop leaves the hardware prefetcher behind: the
      // lines 2 KiB ahead are asked for here (the write without twins gained nothing from it). An
      // address as an integer: a pointer past the array's end would be undefined, a prefetch of it
      // is harmless.
      auto ahead = [](const uint32_t* p) {
        return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + 2048);
      };
      _mm_prefetch(ahead(src + i), _MM_HINT_T0);
      _mm_prefetch(ahead(twin + i), _MM_HINT_T0);
      if (_mm512_mask_cmpneq_epi32_mask(valid, v, _mm512_maskz_loadu_epi32(valid, twin + i))) return i;
    }
    __m512i slot = _mm512_srl_epi32(_mm512_mullo_epi32(v, factor), shift);
    __m512i code = zero;
    __mmask16 pending = valid;
    while (pending) {  // each lane walks its probe chain; a chain ends at its pattern or an empty slot
      // Lanes 0-7 and 8-15 each gather 8 (pattern, code + 1) pairs; the pairs' low and high halves
      // are then packed back into 16 patterns and 16 codes.
      const __m512i low = _mm512_mask_i32gather_epi64(zero, __mmask8(pending), _mm512_castsi512_si256(slot), pairs, 8);
      const __m512i high =
          _mm512_mask_i32gather_epi64(zero, __mmask8(pending >> 8), _mm512_extracti64x4_epi64(slot, 1), pairs, 8);
      const __m512i key =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(low)), _mm512_cvtepi64_epi32(high), 1);
      const __m512i entry =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_srli_epi64(low, 32))),
                             _mm512_cvtepi64_epi32(_mm512_srli_epi64(high, 32)), 1);
      if (_mm512_mask_cmpeq_epi32_mask(pending, entry, zero)) return i;  // a pattern the table lacks
      const __mmask16 found = _mm512_mask_cmpeq_epi32_mask(pending, key, v);
      code = _mm512_mask_mov_epi32(code, found, entry);
      pending &= __mmask16(~found);
      slot = _mm512_and_si512(_mm512_add_epi32(slot, one), mask);
    }
    _mm_mask_storeu_epi8(codes + i, valid, _mm512_cvtepi32_epi8(_mm512_sub_epi32(code, one)));
  }
  return n;
}

}  // namespace

size_t level_encode_u32(const uint32_t* src, size_t n, const uint32_t* slots, int bits, uint8_t* codes,
                        const uint32_t* twin) {
  return twin != nullptr ? encode_u32<true>(src, n, slots, bits, codes, twin)
                         : encode_u32<false>(src, n, slots, bits, codes, nullptr);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#else

bool level_gather_vectorised() { return false; }

template <typename E>
bool level_gather_u8(const uint8_t*, size_t, const uint8_t*, size_t, E*) {
  return false;
}
size_t level_encode_u32(const uint32_t*, size_t, const uint32_t*, int, uint8_t*, const uint32_t*) { return 0; }
template bool level_gather_u8<uint8_t>(const uint8_t*, size_t, const uint8_t*, size_t, uint8_t*);
template bool level_gather_u8<uint16_t>(const uint8_t*, size_t, const uint8_t*, size_t, uint16_t*);
template bool level_gather_u8<uint32_t>(const uint8_t*, size_t, const uint8_t*, size_t, uint32_t*);

#endif

}  // namespace lazymedia
