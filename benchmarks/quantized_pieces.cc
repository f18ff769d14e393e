// Times the pieces of the native quantized step (`_kernels/quantized.cc`) on one
// thread, the way a step runs them: chunks of 256 elements, both moments of AdamW.
// Built and run by `bench_quantized_pieces.py`, which writes the maps' tables.
//
//   quantized_pieces DIR BITS   (BITS: 8 or 4; DIR holds NAME.map and NAME.thr)
//
// Prints one line per piece: its name and ns per element of the leaf.
#include "quantized.cc"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

namespace {

std::vector<float> ReadFloats(const std::string& path, int n) {
  std::vector<float> values(n);
  std::ifstream file(path, std::ios::binary);
  file.read(reinterpret_cast<char*>(values.data()), n * sizeof(float));
  return values;
}

// A quantized moment of `n` elements in blocks of `block`, its codes spread over the map.
struct Moment {
  std::vector<float> map, thresholds, absmax;
  std::vector<uint8_t> codes;
  QuantizedMoment q;

  Moment(const std::string& dir, const char* name, int levels, int64_t n,
         int64_t block) {
    map = ReadFloats(dir + "/" + name + ".map", levels);
    thresholds = ReadFloats(dir + "/" + name + ".thr", levels);
    absmax.assign(n / block, 1.0f);
    q.packed = levels == 16;
    codes.resize(q.packed ? n / 2 : n);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37);
    q.quantized = true;
    q.levels = levels;
    q.n_blocks = n / block;
    q.block = block;
    q.map = map.data();
    q.thresholds = thresholds.data();
    q.codes_in = codes.data();
    q.codes_out = codes.data();
    q.absmax_in = absmax.data();
    q.absmax_out = absmax.data();
    StepTables(q);
    if (!q.packed) {
      for (int c = 0; c < 256; ++c) {
        uint32_t bits;
        std::memcpy(&bits, q.map + c, sizeof bits);
        for (int k = 0; k < 4; ++k) q.planes[k][c] = (bits >> (8 * k)) & 0xFF;
      }
    }
  }
};

// Best of nine runs of `reps` calls, in seconds per call.
template <typename F>
double Seconds(F f, int reps) {
  double best = 1e30;
  for (int r = 0; r < 9; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / reps);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string dir = argv[1];
  const int bits = std::atoi(argv[2]);
  const int64_t n = 1 << 16, chunk = 256;
  const bool eight = bits == 8;
  const int levels = eight ? 256 : 16;
  const int64_t block = eight ? 256 : 128;
  Moment mu(dir, eight ? "dynamic8_signed" : "dynamic4_signed", levels, n, block);
  Moment nu(dir, eight ? "dynamic8_unsigned" : "linear4_unsigned", levels, n, block);
  Moment* moments[2] = {&mu, &nu};
  // New moments as AdamW makes them: signed first moments, non-negative second ones.
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<float> values[2] = {std::vector<float>(n), std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) {
    const float g = normal(rng);
    values[0][i] = g * 1e-3f * (1 + i % 7);
    values[1][i] = g * g * 1e-6f * (1 + i % 5);
  }
  std::vector<float> loaded(2 * chunk), inverses(2 * chunk);
  std::vector<uint8_t> scratch(chunk);
  const int reps = 20;
  auto per_element = [&](double seconds) { return seconds * 1e9 / n; };
  // Seconds per pass of `piece(k, b)` over every chunk b of both moments k.
  auto pass = [&](auto piece) {
    return Seconds(
        [&] {
          for (int64_t b = 0; b < n; b += chunk)
            for (int k = 0; k < 2; ++k) piece(k, b);
        },
        reps);
  };
  const double load = pass([&](int k, int64_t b) {
    Load(moments[k]->q, loaded.data() + k * chunk, b, chunk);
  });
  const double scale = pass([&](int k, int64_t b) {
    Scale(moments[k]->q, values[k].data() + b, b, chunk, chunk,
          inverses.data() + k * chunk);
  });
  const double store = pass([&](int k, int64_t b) {
    Store(moments[k]->q, values[k].data() + b, b, chunk, chunk,
          inverses.data() + k * chunk, scratch.data());
  });
  std::printf("dequantize %.4f\n", per_element(load));
  std::printf("absmax %.4f\n", per_element(scale));
  std::printf("codes %.4f\n", per_element(store));
  return 0;
}
