// The level coder (levels.h: level_encode, level_decode) vectorised for its common case, uint8
// codes, on x86-64 CPUs with AVX-512 VBMI (Ice Lake, Zen 4 and later), chosen at run time; the
// portable loops in levels.cpp are the reference the tests compare these with.
//
// The read (8-, 16- or 32-bit patterns): each table is split into byte planes of 256 entries; 64
// codes look up each plane with two 128-entry byte permutes and a blend on the code's top bit,
// and the planes are interleaved back into elements: a few instructions per 64 elements instead
// of a load per element. The write (32-bit patterns): 16 elements at a time hash, gather their
// slots of the coder's open-addressing table and follow the probe chains in parallel; a block
// holding a pattern the table lacks goes to the portable loop, which adds it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lazymedia {

// Whether this CPU (and OS) runs the vectorised coder.
bool level_gather_vectorised();

// The slot a pattern hashes to in a table of 2^bits slots (Fibonacci hashing; the vectorised
// write computes the 32-bit form 16 lanes at a time).
template <typename E>
inline size_t level_slot(E v, int bits) {
  if constexpr (sizeof(E) == 4) {
    return size_t(uint32_t(uint32_t(v) * 0x9E3779B1u) >> (32 - bits));
  } else {
    return size_t((uint64_t(v) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
  }
}

// codes[i] = code - 1 where slots[2 s] == src[i] and code = slots[2 s + 1] != 0 (pattern and
// code + 1 side by side), s found from level_slot by linear probing, for the leading blocks of 16
// elements whose patterns the table holds (and, where `twin` is not null, that equal twin's):
// how many elements were coded (n, or the start of the first block with a pattern the table lacks
// or unlike its twin). Only where level_gather_vectorised().
size_t level_encode_u32(const uint32_t* src, size_t n, const uint32_t* slots, int bits, uint8_t* codes,
                        const uint32_t* twin = nullptr);

// A group's table as byte planes: planes[p * 256 + c] = byte p of table[c] (zero past `length`),
// for `groups` tables of `length` entries each, as the gather reads them.
template <typename E>
std::vector<uint8_t> level_planes(const E* tables, size_t groups, size_t length);

// dst[i] = table[codes[i]] for i < n, with `planes` one group's level_planes; false when a code is
// >= length (its element is then the zero padding: nothing is read out of bounds). dst may be
// codes itself (1-byte patterns: a renumbering in place). Only where level_gather_vectorised().
template <typename E>
bool level_gather_u8(const uint8_t* codes, size_t n, const uint8_t* planes, size_t length, E* dst);

}  // namespace lazymedia
