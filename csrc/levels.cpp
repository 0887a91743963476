#include "levels.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "level_gather.h"
#include "parallel.h"

namespace lazymedia {
namespace {

// Elements per row of parallel_rows in the level coder: at most kLevelRows rows, each of at least
// kLevelChunk elements.
constexpr size_t kLevelChunk = size_t(1) << 16;
constexpr size_t kLevelRows = 256;
constexpr size_t kLevelRowsPerThread = 4;
// At most this many groups take the vectorised read (their planes: 1 KiB each at most).
constexpr size_t kMaxPlaneGroups = 1024;

// Calls fn(begin, end, group) for the runs of elements [begin, end) that share a group.
template <typename Fn>
void for_group_runs(size_t begin, size_t end, size_t run, size_t groups, Fn fn) {
  while (begin < end) {
    const size_t block = begin / run;
    const size_t stop = std::min(end, (block + 1) * run);
    fn(begin, stop, block % groups);
    begin = stop;
  }
}

// A group's table with its hash: `1 << bits` slots, each a pattern and its code + 1 (0: empty), at
// most an eighth full (a 32nd for uint8 codes), so most lookups end at the first slot, with
// no load that waits on another. Slot s is keys[s * stride] and slots[s * stride]: the vectorised
// write interleaves them (stride 2, 32-bit patterns), so that one 64-bit gather brings both.
template <typename E>
struct LevelHash {
  E* keys;
  uint32_t* slots;
  E* table;
  int bits;
  size_t stride = 1;

  // The code of pattern v, added if new; -1 when the table already holds `levels` patterns.
  long code_of(E v, size_t& count, size_t levels) const {
    size_t s = level_slot(v, bits);
    const size_t mask = (size_t(1) << bits) - 1;
    for (;;) {
      const uint32_t entry = slots[s * stride];
      if (entry == 0) {
        if (count == levels) return -1;
        table[count] = v;
        keys[s * stride] = v;
        slots[s * stride] = uint32_t(++count);
        return long(count - 1);
      }
      if (keys[s * stride] == v) return long(entry - 1);
      s = (s + 1) & mask;
    }
  }
};

}  // namespace

template <typename E, typename C>
bool level_encode(const E* src, size_t n, size_t run, size_t groups, size_t levels, C* codes, E* tables, size_t* counts,
                  int threads, bool vectorise, size_t half) {
  constexpr bool kVectorForm = std::is_same_v<E, uint32_t> && std::is_same_v<C, uint8_t>;
  vectorise = vectorise && kVectorForm && level_gather_vectorised();
  if (run == 0 || groups == 0 || levels == 0 || levels - 1 > size_t(C(~C(0)))) return false;
  if (half > 0 && (half > n || n % (2 * half) != 0 || run % (2 * half) != 0)) return false;  // half <= n: 2 * half fits
  if (n == 0) {  // nothing to code: every table empty
    std::fill(counts, counts + groups, size_t(0));
    return true;
  }
  run = std::min(run, std::max(n, size_t(1)));  // the same groups; keeps (block + 1) * run from overflowing
  // With `half`, element j of the coded sequence is the source's element (j / half) * 2 * half +
  // j % half (each block's first half), in group (j / (run / 2)) % groups; the rest of this
  // function codes that sequence, of n / 2 elements and runs of run / 2.
  const size_t coded = half > 0 ? n / 2 : n;
  const size_t coded_run = half > 0 ? run / 2 : run;
  int bits = 2;
  // Sparse tables for uint8 codes (at most 256 levels): the vectorised write's probe loop runs
  // again for all 16 lanes when one lane's first slot holds another pattern, and the portable
  // loop's probes are cache misses; tables of up to 4096 levels stay 8x their levels.
  while ((size_t(1) << bits) < (levels <= 256 ? 32 : 8) * levels) ++bits;
  const size_t slots = size_t(1) << bits;
  // Each row codes its chunk against tables of its own, in parallel; the rows' tables are then
  // merged into the result's (one lookup per level) and each row's codes renumbered through a
  // table of its codes (skipped where the numbering is already the result's).
  // A few rows a thread where there are several (each row finds every level again and is
  // renumbered after, so fewer is cheaper, as long as each thread has some to take); one thread
  // codes the tensor as one row (the cache's writer: no renumbering at all).
  const size_t row_count = threads <= 1 ? 1 : std::min(kLevelRows, size_t(threads) * kLevelRowsPerThread);
  const size_t chunk = std::max(kLevelChunk, (coded + row_count - 1) / row_count);
  const size_t rows = (coded + chunk - 1) / chunk;
  std::vector<E> local(rows * groups * levels);
  std::vector<size_t> local_counts(rows * groups, 0);
  // The vectorised form's slots hold pattern and code side by side (uint32 both); the others'
  // patterns lie in `keys` (read only where a slot's code is set). Each row clears its own slots,
  // on its own thread.
  constexpr size_t kSlotWords = kVectorForm ? 2 : 1;
  const std::unique_ptr<uint32_t[]> hash(new uint32_t[rows * groups * slots * kSlotWords]);
  const std::unique_ptr<E[]> keys(new E[kVectorForm ? 0 : rows * groups * slots]);
  std::atomic<bool> stop{false};  // a group past its levels, or (with half) a block whose halves differ
  parallel_blocks(int(rows), threads, 1, [&](int r) {  // a few large rows: one each is worth a thread
    if (stop.load(std::memory_order_relaxed)) return;
    const size_t base = size_t(r) * groups;
    std::fill(hash.get() + base * slots * kSlotWords, hash.get() + (base + groups) * slots * kSlotWords, 0u);
    for_group_runs(size_t(r) * chunk, std::min(coded, size_t(r + 1) * chunk), coded_run, groups,
                   [&](size_t begin, size_t end, size_t g) {
                     if (stop.load(std::memory_order_relaxed)) return;
                     LevelHash<E> level{keys.get(), hash.get() + (base + g) * slots, local.data() + (base + g) * levels,
                                        bits};
                     if constexpr (kVectorForm) {
                       level.keys = hash.get() + (base + g) * slots * 2;
                       level.slots = level.keys + 1;
                       level.stride = 2;
                     } else {
                       level.keys += (base + g) * slots;
                     }
                     size_t count = local_counts[base + g];  // a local: the uint8 code stores may alias anything
                     // Codes from[0, length) into to[0, length): false once the group is past its levels
                     // or (where twin is not null) an element differs from its twin's.
                     auto code_span = [&](const E* from, size_t length, C* to, const E* twin) {
                       long code = 0;
                       if constexpr (kVectorForm) {
                         // Blocks of 16 whose patterns the table holds (and equal their twins) are coded
                         // 16 at a time; a block with a new pattern takes the loop below, which adds it.
                         for (size_t i = 0; vectorise && code >= 0 && i < length;) {
                           i += level_encode_u32(from + i, length - i, level.keys, level.bits, to + i,
                                                 twin != nullptr ? twin + i : nullptr);
                           for (const size_t block_end = std::min(length, i + 16); code >= 0 && i < block_end; ++i) {
                             if (twin != nullptr && twin[i] != from[i]) return false;
                             code = level.code_of(from[i], count, levels);
                             to[i] = C(code);
                           }
                         }
                       }
                       E last = from[0];
                       if (!vectorise) code = level.code_of(last, count, levels);
                       for (size_t i = 0; !vectorise && code >= 0 && i < length; ++i) {
                         const E v = from[i];
                         if (twin != nullptr && twin[i] != v) return false;
                         if (v != last) {  // neighbouring pixels often repeat
                           code = level.code_of(v, count, levels);
                           last = v;
                         }
                         to[i] = C(code);
                       }
                       return code >= 0;
                     };
                     bool coding = true;
                     if (half == 0) {
                       coding = code_span(src + begin, end - begin, codes + begin, nullptr);
                     } else {
                       // Each piece within one block: its first half coded, each element checked
                       // against its twin in the second half as it is.
                       for (size_t j = begin; coding && j < end;) {
                         const size_t block = j / half, offset = j % half;
                         const size_t length = std::min(end, (block + 1) * half) - j;
                         const E* from = src + 2 * half * block + offset;
                         coding = code_span(from, length, codes + j, from + half);
                         j += length;
                       }
                     }
                     local_counts[base + g] = count;
                     if (!coding) stop.store(true, std::memory_order_relaxed);
                   });
  });
  if (stop.load()) return false;
  std::vector<uint32_t> merged(groups * slots, 0);
  std::vector<E> merged_keys(groups * slots);
  std::vector<C> renumber(rows * groups * levels);
  std::vector<uint8_t> identity(rows, 1);
  std::fill(counts, counts + groups, size_t(0));
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const size_t at = (r * groups + g) * levels;
      for (size_t j = 0; j < local_counts[r * groups + g]; ++j) {
        const LevelHash<E> level{merged_keys.data() + g * slots, merged.data() + g * slots, tables + g * levels, bits};
        const long code = level.code_of(local[at + j], counts[g], levels);
        if (code < 0) return false;
        renumber[at + j] = C(code);
        if (size_t(code) != j) identity[r] = 0;
      }
    }
  }
  // Each row's renumbering as byte planes (uint8 codes, vectorised): 64 codes a few instructions.
  std::vector<uint8_t> planes;
  if constexpr (std::is_same_v<C, uint8_t>) {
    if (vectorise && rows * groups <= kMaxPlaneGroups) planes = level_planes(renumber.data(), rows * groups, levels);
  }
  parallel_blocks(int(rows), threads, 1, [&](int r) {
    if (identity[size_t(r)]) return;
    const C* to = renumber.data() + size_t(r) * groups * levels;
    if constexpr (std::is_same_v<C, uint8_t>) {
      if (!planes.empty()) {
        const uint8_t* row_planes = planes.data() + size_t(r) * groups * 256;
        for_group_runs(size_t(r) * chunk, std::min(coded, size_t(r + 1) * chunk), coded_run, groups,
                       [&](size_t begin, size_t end, size_t g) {
                         level_gather_u8(codes + begin, end - begin, row_planes + g * 256, levels, codes + begin);
                       });
        return;
      }
    }
    for_group_runs(size_t(r) * chunk, std::min(coded, size_t(r + 1) * chunk), coded_run, groups,
                   [&](size_t begin, size_t end, size_t g) {
                     const C* table = to + g * levels;
                     for (size_t i = begin; i < end; ++i) codes[i] = table[codes[i]];
                   });
  });
  return true;
}

// dst[i] = table[codes[i]] for i < count; false for a code past `length` (its element left alone).
template <typename E, typename C>
bool gather_portable(const C* codes, size_t count, const E* table, size_t length, E* dst) {
  bool in_table = true;
  for (size_t i = 0; i < count; ++i) {
    const C code = codes[i];
    if (size_t(code) >= length) {
      in_table = false;
      continue;
    }
    dst[i] = table[code];
  }
  return in_table;
}

template <typename E, typename C>
bool level_decode(const C* codes, size_t n, size_t run, size_t groups, const E* tables, size_t length, E* dst,
                  int threads, bool vectorise, size_t half) {
  if (run == 0 || groups == 0 || length == 0) return false;
  if (half > 0 && (half > n || n % half != 0 || run % (2 * half) != 0)) return false;  // half <= n: 2 * half fits
  if (n == 0) return true;
  const size_t rows = (n + kLevelChunk - 1) / kLevelChunk;
  if (rows > size_t(1) << 30) return false;
  // The vectorised read takes each group's table as byte planes (256 * sizeof(E) bytes a group:
  // bounded here, whatever a value's header says).
  std::vector<uint8_t> planes;
  if constexpr (std::is_same_v<C, uint8_t> && (sizeof(E) == 2 || sizeof(E) == 4)) {
    if (vectorise && groups <= kMaxPlaneGroups && level_gather_vectorised())
      planes = level_planes(tables, groups, length);
  }
  auto gather = [&](size_t begin, size_t end, size_t g, E* to) {
    if constexpr (std::is_same_v<C, uint8_t> && (sizeof(E) == 2 || sizeof(E) == 4)) {
      if (!planes.empty()) {
        return level_gather_u8(codes + begin, end - begin, planes.data() + g * sizeof(E) * 256, length, to);
      }
    }
    return gather_portable(codes + begin, end - begin, tables + g * length, length, to);
  };
  std::atomic<bool> bad{false};
  if (half == 0) {
    run = std::min(run, n);  // the same groups; keeps (block + 1) * run from overflowing
    parallel_rows(int(rows), threads, [&](int r) {
      bool out_of_table = false;
      for_group_runs(size_t(r) * kLevelChunk, std::min(n, size_t(r + 1) * kLevelChunk), run, groups,
                     [&](size_t begin, size_t end, size_t g) { out_of_table |= !gather(begin, end, g, dst + begin); });
      if (out_of_table) bad.store(true, std::memory_order_relaxed);
    });
    return !bad.load();
  }
  // Of each block of 2 * half outputs (within one run, so one group) the codes hold the first
  // half's: gathered, then copied into the second half while they are in cache.
  const size_t blocks = n / half, per_row = std::max(size_t(1), kLevelChunk / half);
  if ((blocks + per_row - 1) / per_row > size_t(1) << 30) return false;
  parallel_rows(int((blocks + per_row - 1) / per_row), threads, [&](int r) {
    bool out_of_table = false;
    for (size_t b = size_t(r) * per_row; b < std::min(blocks, size_t(r + 1) * per_row); ++b) {
      E* to = dst + 2 * half * b;
      out_of_table |= !gather(half * b, half * (b + 1), (2 * half * b / run) % groups, to);
      std::memcpy(to + half, to, half * sizeof(E));
    }
    if (out_of_table) bad.store(true, std::memory_order_relaxed);
  });
  return !bad.load();
}

#define LAZYMEDIA_LEVELS(E, C)                                                                                    \
  template bool level_encode<E, C>(const E*, size_t, size_t, size_t, size_t, C*, E*, size_t*, int, bool, size_t); \
  template bool level_decode<E, C>(const C*, size_t, size_t, size_t, const E*, size_t, E*, int, bool, size_t);
LAZYMEDIA_LEVELS(uint16_t, uint8_t)
LAZYMEDIA_LEVELS(uint32_t, uint8_t)
LAZYMEDIA_LEVELS(uint64_t, uint8_t)
LAZYMEDIA_LEVELS(uint16_t, uint16_t)
LAZYMEDIA_LEVELS(uint32_t, uint16_t)
LAZYMEDIA_LEVELS(uint64_t, uint16_t)
#undef LAZYMEDIA_LEVELS

}  // namespace lazymedia
