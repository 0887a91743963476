// A stand-in for libFuzzer's driver where clang is missing (tests/fuzz/run.sh builds the targets
// with g++ and ASan/UBSan against it): random inputs of random lengths, every other one with its
// bytes after the first eight folded into 0-3 (small codes and sizes: the cases that succeed).
//   <target> [inputs] [seed] [op]   (op: the value for input byte 6, which selects a kernel)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  const long inputs = argc > 1 ? std::atol(argv[1]) : 10000;
  std::mt19937 rng(argc > 2 ? unsigned(std::atol(argv[2])) : 1u);
  const int op = argc > 3 ? std::atoi(argv[3]) : -1;
  for (long i = 0; i < inputs; ++i) {
    std::vector<uint8_t> data(8 + rng() % 9000);
    for (auto& b : data) b = uint8_t(rng());
    if (op >= 0) data[6] = uint8_t(op);
    if (i % 2) {
      for (size_t j = 8; j < data.size(); ++j) data[j] = uint8_t(data[j] % 4);
    }
    LLVMFuzzerTestOneInput(data.data(), data.size());
  }
  std::printf("%ld inputs, no finding\n", inputs);
  return 0;
}
