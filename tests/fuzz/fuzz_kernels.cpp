// libFuzzer target: the CPU kernel drivers with sizes and parameters taken from the input, so
// every index computation is exercised under ASan/UBSan. The input's tail is the pixel data. Op 4
// is the cache's level coder: codes and tables as a stored value could hold them, read by the
// vectorised form and the portable loop (which must agree), and patterns coded both ways.
#include <cstdint>
#include <cstring>
#include <vector>

#include "host_ops.h"
#include "level_gather.h"
#include "levels.h"

namespace {
struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazymedia;
  Reader in{data, size};
  const int h = 1 + in.next() % 48, w = 1 + in.next() % 48, c = 1 + in.next() % 4;
  const int oh = 1 + in.next() % 64, ow = 1 + in.next() % 64;
  const int orientation = in.next() % 10;  // includes invalid 0 and 9
  const int op = in.next() % 5;
  const int threads = 1 + in.next() % 3;
  std::vector<uint8_t> src(size_t(h) * w * c);
  for (size_t i = 0; i < src.size(); ++i) src[i] = in.next();
  switch (op) {
    case 0: {
      std::vector<uint8_t> dst(src.size());
      orient_hwc(src.data(), dst.data(), h, w, c, orientation, threads);
      break;
    }
    case 1: {
      std::vector<uint8_t> dst(size_t(oh) * ow * c);
      resize_hwc(src.data(), h, w, c, dst.data(), oh, ow,
                 orientation % 2 ? kernels::Filter::Bicubic : kernels::Filter::Bilinear, threads);
      break;
    }
    case 2: {
      const int cw = (w + 1) / 2, ch = (h + 1) / 2;
      std::vector<uint8_t> y(size_t(h) * w), uv(size_t(ch) * cw * 2), rgb(size_t(h) * w * 3);
      std::memcpy(y.data(), src.data(), std::min(y.size(), src.size()));
      nv12_to_rgb(y.data(), w, uv.data(), cw * 2, h, w, rgb.data(), kernels::Matrix(orientation % 2), op & 1, threads);
      std::vector<uint8_t> u(size_t(ch) * cw), v(size_t(ch) * cw);
      i420_to_rgb(y.data(), w, u.data(), v.data(), cw, h, w, rgb.data(), kernels::Matrix::BT709, true, threads);
      break;
    }
    case 4: {
      const size_t run = 1 + in.next(), groups = 1 + in.next() % 4, length = 1 + in.next();
      std::vector<uint32_t> tables(groups * length);
      for (auto& t : tables) t = uint32_t(in.next()) * 0x01000193u;
      std::vector<uint32_t> fast(src.size()), portable(src.size());
      const bool a =
          level_decode(src.data(), src.size(), run, groups, tables.data(), length, fast.data(), threads, true);
      const bool b =
          level_decode(src.data(), src.size(), run, groups, tables.data(), length, portable.data(), threads, false);
      if (a != b || (a && fast != portable)) __builtin_trap();
      // The read of repeated halves (each block of 2 * half elements from half its codes), with
      // runs of 1-4 such blocks: both paths agree, or both refuse (a half that does not divide).
      const size_t half = 1 + in.next() % 8, halved_run = 2 * half * (1 + in.next() % 4);
      std::vector<uint32_t> fast_halves(2 * src.size()), portable_halves(2 * src.size());
      const bool c = level_decode(src.data(), src.size(), halved_run, groups, tables.data(), length, fast_halves.data(),
                                  threads, true, half);
      const bool d = level_decode(src.data(), src.size(), halved_run, groups, tables.data(), length,
                                  portable_halves.data(), threads, false, half);
      if (c != d || (c && fast_halves != portable_halves)) __builtin_trap();
      // Repeated up to 32 times: past one row of the coder (64 Ki elements), so rows are renumbered.
      const size_t repeats = 1 + in.next() % 32;
      std::vector<uint32_t> patterns(src.size() * repeats);
      for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = tables[src[i % src.size()] % tables.size()];
      std::vector<uint8_t> codes[2] = {std::vector<uint8_t>(patterns.size()), std::vector<uint8_t>(patterns.size())};
      std::vector<uint32_t> coded[2] = {std::vector<uint32_t>(groups * 256), std::vector<uint32_t>(groups * 256)};
      std::vector<size_t> counts[2] = {std::vector<size_t>(groups), std::vector<size_t>(groups)};
      bool ok[2];
      for (int v = 0; v < 2; ++v) {
        ok[v] = level_encode(patterns.data(), patterns.size(), run, groups, 256, codes[v].data(), coded[v].data(),
                             counts[v].data(), threads, v == 0);
      }
      if (ok[0] != ok[1] || (ok[0] && (codes[0] != codes[1] || coded[0] != coded[1] || counts[0] != counts[1]))) {
        __builtin_trap();
      }
      // The write of repeated halves: the patterns' blocks of 2 * half made to repeat (one element
      // changed where the input says), both paths agree, and where both code, the halves read
      // gives the patterns back; a half that does not divide is refused by both.
      if (in.next() % 4 != 0) patterns[(size_t(in.next()) << 8 | in.next()) % patterns.size()] ^= 1u;
      std::vector<uint32_t> repeated(patterns.size() - patterns.size() % (2 * half));
      for (size_t i = 0; i < repeated.size(); ++i) repeated[i] = patterns[i / (2 * half) * 2 * half + i % half];
      if (!repeated.empty() && in.next() % 2) repeated[(size_t(in.next()) << 8 | in.next()) % repeated.size()] ^= 1u;
      for (int v = 0; v < 2; ++v) {
        codes[v].assign(repeated.size() / 2, 0);
        std::fill(coded[v].begin(), coded[v].end(), 0u);
        ok[v] = level_encode(repeated.data(), repeated.size(), halved_run, groups, 256, codes[v].data(),
                             coded[v].data(), counts[v].data(), threads, v == 0, half);
      }
      if (ok[0] != ok[1] || (ok[0] && (codes[0] != codes[1] || coded[0] != coded[1] || counts[0] != counts[1]))) {
        __builtin_trap();
      }
      if (ok[0] && !repeated.empty()) {
        std::vector<uint32_t> back(repeated.size());
        if (!level_decode(codes[0].data(), codes[0].size(), halved_run, groups, coded[0].data(), 256, back.data(),
                          threads, true, half) ||
            back != repeated) {
          __builtin_trap();
        }
      }
      break;
    }
    default: {
      std::vector<float> out(src.size());
      const float mean[4] = {0.5f, 0.4f, 0.3f, 0.2f}, sd[4] = {0.2f, 0.3f, 0.0f, 0.5f};
      hwc_to_chw_normalized(src.data(), h, w, c, mean, sd, out.data(), threads);
      std::vector<uint8_t> chw(src.size()), back(src.size());
      hwc_to_chw(src.data(), h, w, c, chw.data(), threads);
      chw_to_hwc(chw.data(), h, w, c, back.data(), threads);
      if (back != src) __builtin_trap();
      break;
    }
  }
  return 0;
}
