// The cache's level coder (lazymedia/levels.py wraps it; lazymedia/cache/serialize.py stores its
// codes and tables, so the cache's file format depends on what this file computes). Its
// vectorised forms (AVX-512 VBMI, chosen at run time) are in level_gather.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazymedia {

// Level coding of a tensor's element bit patterns E (uint16/32/64_t) as codes C (uint8/16_t), for
// the cache's values (lazymedia/cache/serialize.py). Element i belongs to group (i / run) % groups;
// group g's table is tables[g * levels, (g + 1) * levels), its distinct patterns in order of first
// appearance. level_encode writes codes[i] (src[i] == tables[g * levels + codes[i]], bit for bit)
// and counts[g]; false, early, when a group has more than `levels` patterns or a size is out of
// range (codes and tables then hold partial results). One pass over src on up to `threads`
// threads (each codes its chunk against tables of its own, then the codes are renumbered).
// `vectorise`: 32-bit patterns in uint8 codes take level_gather.h's write where the CPU has it.
// `half` > 0: every block of 2 * half elements must repeat its first half (bit for bit; false
// where one does not), and only the first halves are coded: codes then holds n / 2 codes, as
// level_decode's `half` reads them (run a multiple of 2 * half, n of 2 * half).
template <typename E, typename C>
bool level_encode(const E* src, size_t n, size_t run, size_t groups, size_t levels, C* codes, E* tables, size_t* counts,
                  int threads, bool vectorise = true, size_t half = 0);

// dst[i] = tables[g * length + codes[i]], on up to `threads` threads. False when a code is >= length
// (such an element is not read from the table: nothing is read out of bounds; dst is then partial)
// or a size is out of range. tables holds groups * length entries. `vectorise`: uint8 codes of
// 16/32-bit patterns take level_gather.h's read where the CPU has it (false: the portable loop).
// `half` > 0: of each block of 2 * half elements the codes hold the first half's, the second half
// repeating it (a processor's image tiled twice); dst then holds 2 * n elements, group g of element
// i is (i / run) % groups as ever, and run must be a multiple of 2 * half and n of half.
template <typename E, typename C>
bool level_decode(const C* codes, size_t n, size_t run, size_t groups, const E* tables, size_t length, E* dst,
                  int threads, bool vectorise = true, size_t half = 0);

}  // namespace lazymedia
