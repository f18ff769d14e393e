"""The native kernel's AVX-512 code searches (`_kernels/quantized.cc`: a binary
search over each map's thresholds held in registers, and for 8-bit maps with
AVX-512 VBMI one over the thresholds' 16-bit keys, then one correction) against its
scalar search (the
bucket look-ups of `_quantized.search_entries`, which
`test_quantized_native.test_lookup_codes_are_the_binary_searchs` checks against
torchao's binary search), for every float32 bit pattern and each map, and the
unclamped form `Store` uses for blocks with a finite absmax for every float32 it
can be given (magnitude at most 1 + 2^-23): a small C++ program built from the
kernel's own source."""

import subprocess

import numpy as np
import pytest

from eqxopt._core import _storage

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

_build = pytest.importorskip("eqxopt._native._build")
_quantized = pytest.importorskip("eqxopt._native._quantized")

MAPS = ["dynamic8_signed", "dynamic8_unsigned", "dynamic4_signed", "linear4_unsigned"]

PROGRAM = r"""
#include "common.h"
#include "quantized.cc"
#include <cstdio>
#include <thread>

template <class T> std::vector<T> Read(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<T> v(size / sizeof(T));
  if (std::fread(v.data(), 1, size, f) != static_cast<size_t>(size)) std::abort();
  std::fclose(f);
  return v;
}

int main(int argc, char** argv) {
  if (!kAvx512) {
    std::printf("no avx512\n");
    return 0;
  }
  const std::string base = argv[1];
  const auto entries = Read<int32_t>(base + ".entries");
  const auto geometry = Read<int32_t>(base + ".geometry");
  const auto thresholds = Read<float>(base + ".thresholds");
  QuantizedMoment m;
  m.levels = static_cast<int64_t>(thresholds.size());
  m.buckets = entries.data();
  m.n_buckets = static_cast<int64_t>(entries.size());
  m.shift = geometry[0];
  m.low = geometry[1];
  m.thresholds = thresholds.data();
  StepTables(m);
  const Search scalar(m);
  // Every bit pattern, in two halves on two threads.
  uint64_t mismatches[2] = {0, 0}, checked_bounded[2] = {0, 0};
  auto sweep = [&](int half) {
    const int64_t n = 1 << 16;
    std::vector<float> x(n);
    std::vector<float> bounded(n);
    std::vector<uint8_t> codes(n), fallback(n), expected(n), bounded_expected(n);
    for (uint64_t high = uint64_t{half} << 31; high < (uint64_t{half} + 1) << 31;
         high += n) {
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t bits = static_cast<uint32_t>(high + j);
        std::memcpy(&x[j], &bits, sizeof bits);
      }
      Encode(m, scalar, x.data(), n, 1.0f, codes.data());
      // Without VBMI, 8-bit codes come from `Search256`: check it as well.
      if (m.levels == 256) {
        CodesAvx512<Search256, 8>(m, scalar, x.data(), n, 1.0f, fallback.data());
      }
      int64_t n_bounded = 0;
      for (int64_t j = 0; j < n; ++j) {
        expected[j] = scalar(x[j] * 1.0f);
        if (codes[j] != expected[j]) ++mismatches[half];
        if (m.levels == 256 && fallback[j] != expected[j]) ++mismatches[half];
        // Every value a block with a finite absmax can give (`Store`).
        if (std::fabs(x[j]) <= 1.0f + 0x1p-23f) {
          bounded[n_bounded] = x[j];
          bounded_expected[n_bounded++] = expected[j];
        }
      }
      Encode(m, scalar, bounded.data(), n_bounded, 1.0f, codes.data(), true);
      for (int64_t j = 0; j < n_bounded; ++j) {
        if (codes[j] != bounded_expected[j]) ++mismatches[half];
      }
      checked_bounded[half] += n_bounded;
      // Also 64 at a time (the search's short form, and its scalar end).
      for (int64_t j = 0; j < n; j += 64) {
        Encode(m, scalar, x.data() + j, 64, 1.0f, codes.data() + j);
      }
      for (int64_t j = 0; j < n; ++j) {
        if (codes[j] != expected[j]) ++mismatches[half];
      }
      for (int64_t j = 0; j < n_bounded; j += 64) {
        const int64_t count = std::min<int64_t>(64, n_bounded - j);
        Encode(m, scalar, bounded.data() + j, count, 1.0f, codes.data() + j, true);
      }
      for (int64_t j = 0; j < n_bounded; ++j) {
        if (codes[j] != bounded_expected[j]) ++mismatches[half];
      }
    }
  };
  std::thread other(sweep, 1);
  sweep(0);
  other.join();
  std::printf("mismatches %llu bounded %llu\n",
              static_cast<unsigned long long>(mismatches[0] + mismatches[1]),
              static_cast<unsigned long long>(checked_bounded[0] + checked_bounded[1]));
  return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    directory = tmp_path_factory.mktemp("search")
    source = directory / "search.cc"
    source.write_text(PROGRAM)
    binary = directory / "search"
    try:
        _build.build_harness(source, binary)
    except _build.NativeBuildError as error:
        pytest.skip(str(error))  # no C++ compiler
    return directory, binary


@pytest.mark.slow
@pytest.mark.parametrize("name", MAPS)
def test_avx512_search_gives_the_scalar_code_for_every_float32(program, name):
    directory, binary = program
    base = directory / name
    tables = _storage.search_tables(name)
    _quantized.search_entries(name).tofile(f"{base}.entries")
    np.asarray([tables.shift, tables.low], np.int32).tofile(f"{base}.geometry")
    np.asarray(tables.thresholds, np.float32).tofile(f"{base}.thresholds")
    result = subprocess.run(
        [str(binary), str(base)], check=True, capture_output=True, text=True
    )
    if result.stdout.strip() == "no avx512":
        pytest.skip("this CPU has no AVX-512")
    # The bounded sweep: the numbers of magnitude at most 1 + 2^-23, both signs.
    assert result.stdout.strip() == f"mismatches 0 bounded {2 * (0x3F800001 + 1)}"
