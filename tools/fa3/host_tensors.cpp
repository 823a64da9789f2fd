#include "host_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

#include "common/numeric.h"
#include "errors.h"
#include "format.h"

namespace fa3::cli {
namespace {

// Elements per independently seeded chunk: large enough to amortise a thread, small
// enough to spread a few-megabyte tensor over every core.
constexpr std::int64_t kChunk = std::int64_t{1} << 16;

// SplitMix64: a tiny, well-mixed generator; one per chunk, seeded from the chunk index,
// so that the values do not depend on how chunks are divided among threads.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so the logarithm below stays finite.
  double uniform() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }
};

void fill_chunk(void* data, DType dtype, std::int64_t begin, std::int64_t end, std::uint64_t seed) {
  SplitMix64 rng{seed};
  // Box-Muller: two uniforms give two independent normals.
  for (std::int64_t i = begin; i < end; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(rng.uniform()));
    const double t = 2.0 * std::numbers::pi * rng.uniform();
    numeric::store_from_float(data, i, dtype, static_cast<float>(r * std::cos(t)));
    if (i + 1 < end) numeric::store_from_float(data, i + 1, dtype, static_cast<float>(r * std::sin(t)));
  }
}

std::size_t bytes_of(std::int64_t elements, DType dtype) {
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(elements), dtype_size(dtype), &bytes)) {
    throw RunError("the tensors of this shape do not fit in memory");
  }
  return bytes;
}

// A refused allocation is the user's shape meeting this machine: say how much was asked.
std::unique_ptr<std::byte[]> allocate(std::size_t bytes, const char* what) {
  try {
    return std::unique_ptr<std::byte[]>(new std::byte[bytes]);
  } catch (const std::bad_alloc&) {
    throw RunError(std::string("cannot allocate ") + bytes_text(static_cast<double>(bytes)) +
                   " of host memory for " + what);
  }
}

}  // namespace

void fill_normal(void* data, DType dtype, std::int64_t count, std::uint64_t seed, std::uint64_t stream) {
  const std::int64_t chunks = (count + kChunk - 1) / kChunk;
  const std::int64_t workers =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::thread::hardware_concurrency()), 1, chunks);
  auto work = [&](std::int64_t first) {
    for (std::int64_t c = first; c < chunks; c += workers) {
      SplitMix64 mix{seed ^ (stream * 0x632be59bd9b4e019ull) ^ (static_cast<std::uint64_t>(c) << 20)};
      fill_chunk(data, dtype, c * kChunk, std::min(count, (c + 1) * kChunk), mix.next());
    }
  };
  if (workers <= 1) {
    work(0);
    return;
  }
  std::vector<std::jthread> threads;
  for (std::int64_t w = 0; w < workers; ++w) threads.emplace_back(work, w);
}

void fill_nan(void* data, std::size_t bytes) { std::memset(data, 0xff, bytes); }

HostTensors::HostTensors(const TensorCapacity& capacity, DType dtype, std::uint64_t seed,
                         const std::vector<float>& sinks)
    : q_bytes_(bytes_of(capacity.q_elements, dtype)),
      kv_bytes_(bytes_of(capacity.kv_elements, dtype)),
      v_bytes_(bytes_of(capacity.v_elements, dtype)),
      out_bytes_(bytes_of(capacity.out_elements, output_dtype(dtype))),
      lse_bytes_(bytes_of(capacity.lse_elements, DType::kFloat32)),
      sinks_bytes_(sinks.size() * sizeof(float)),
      q_(allocate(q_bytes_, "q")),
      k_(allocate(kv_bytes_, "k")),
      v_(allocate(v_bytes_, "v")),
      out_(allocate(out_bytes_, "out")),
      lse_(allocate(lse_bytes_, "lse")),
      sinks_(allocate(sinks_bytes_, "sinks")) {
  fill_normal(q_.get(), dtype, capacity.q_elements, seed, 0);
  fill_normal(k_.get(), dtype, capacity.kv_elements, seed, 1);
  fill_normal(v_.get(), dtype, capacity.v_elements, seed, 2);
  fill_nan(out_.get(), out_bytes_);
  fill_nan(lse_.get(), lse_bytes_);
  std::copy(sinks.begin(), sinks.end(), reinterpret_cast<float*>(sinks_.get()));
}

HostGradients::HostGradients(const TensorCapacity& capacity, DType dtype, std::uint64_t seed)
    : q_bytes_(bytes_of(capacity.q_elements, dtype)),
      kv_bytes_(bytes_of(capacity.kv_elements, dtype)),
      v_bytes_(bytes_of(capacity.v_elements, dtype)),
      out_bytes_(bytes_of(capacity.out_elements, dtype)),
      dout_(allocate(out_bytes_, "dout")),
      dq_(allocate(q_bytes_, "dq")),
      dk_(allocate(kv_bytes_, "dk")),
      dv_(allocate(v_bytes_, "dv")) {
  fill_normal(dout_.get(), dtype, capacity.out_elements, seed, 3);
  fill_nan(dq_.get(), q_bytes_);
  fill_nan(dk_.get(), kv_bytes_);
  fill_nan(dv_.get(), v_bytes_);
}

std::vector<std::byte> HostGradients::gradient_bytes() const {
  std::vector<std::byte> bytes;
  bytes.reserve(q_bytes_ + kv_bytes_ + v_bytes_);
  bytes.insert(bytes.end(), dq_.get(), dq_.get() + q_bytes_);
  bytes.insert(bytes.end(), dk_.get(), dk_.get() + kv_bytes_);
  bytes.insert(bytes.end(), dv_.get(), dv_.get() + v_bytes_);
  return bytes;
}

}  // namespace fa3::cli
