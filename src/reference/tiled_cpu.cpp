#include "reference/tiled_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "common/numeric.h"

namespace fa3::reference {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How a raw score q . k enters the softmax. The kernel works in base 2: scores are
// kept in log2 units, x = raw * scale * log2(e), so that a key's weight is
// exp2(x - max) and needs no further multiply; the softmax scale and log2(e) are
// folded into one factor. Under softcap the score is softcap * tanh(raw * scale /
// softcap), so the factor carries softcap * log2(e) instead. Scaling before taking
// the max gives the row's largest score a weight of exactly 1.
struct ScoreMap {
  float pre_tanh = 0.f;  // scale / softcap; only used under softcap
  float log2_mult = 0.f;
  bool softcap = false;

  explicit ScoreMap(const Problem& p) : softcap(p.softcap > 0.f) {
    if (softcap) {
      pre_tanh = p.softmax_scale / p.softcap;
      log2_mult = p.softcap * kLog2e;
    } else {
      log2_mult = p.softmax_scale * kLog2e;
    }
  }
  float operator()(float raw) const { return (softcap ? std::tanh(raw * pre_tanh) : raw) * log2_mult; }
};

// Work item: one block of query rows of one (batch, query head).
struct QueryBlock {
  std::int64_t batch = 0;
  std::int64_t head = 0;
  std::int64_t row0 = 0;  // first query row
  std::int64_t rows = 0;  // block_m, or fewer in the tail block
};

// Per-thread tiles, allocated once per thread and reused for every work item.
struct Tiles {
  std::int64_t block_m, block_n, head_dim, head_dim_v;
  std::vector<float> q, k;     // (block_m | block_n) x head_dim
  std::vector<float> v;        // block_n x head_dim_v
  std::vector<float> s;        // block_m x block_n scores, then probabilities
  std::vector<float> acc;      // block_m x head_dim_v unnormalised output
  std::vector<float> row_max;  // running max of the scores (log2 units), per query row
  std::vector<float> row_sum;  // running sum of exp2 weights, relative to row_max

  Tiles(std::int64_t bm, std::int64_t bn, std::int64_t d, std::int64_t dv)
      : block_m(bm),
        block_n(bn),
        head_dim(d),
        head_dim_v(dv),
        q(bm * d),
        k(bn * d),
        v(bn * dv),
        s(bm * bn),
        acc(bm * dv),
        row_max(bm),
        row_sum(bm) {}
};

std::int64_t element(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2] + i3 * t.stride[3];
}

// The scale of the rows of one (batch, head) of an e4m3 tensor: its descale times the
// scale of the row's block (fa3/attention.h's Fp8Args), each 1 when not given; 1 for
// inputs of other dtypes, which carry no scales.
struct RowScale {
  float descale = 1.f;
  const float* block = nullptr;  // this (batch, head)'s block scales, or none
  std::int64_t block_stride = 0;
  std::int64_t block_rows = 1;

  RowScale() = default;
  // `descale_head` indexes the (batch, nheads_kv) descale, `head` the block scales.
  RowScale(const TensorView& descales, const TensorView& blocks, int rows_per_block, std::int64_t b,
           std::int64_t descale_head, std::int64_t head) {
    if (descales.defined()) {
      descale = static_cast<const float*>(descales.data)[b * descales.stride[0] + descale_head * descales.stride[1]];
    }
    if (blocks.defined()) {
      block = static_cast<const float*>(blocks.data) + b * blocks.stride[0] + head * blocks.stride[1];
      block_stride = blocks.stride[2];
      block_rows = rows_per_block;
    }
  }
  float operator()(std::int64_t row) const {
    return block == nullptr ? descale : descale * block[(row / block_rows) * block_stride];
  }
};

// Copies `rows` rows (b, s0 + r, h, :) of a (batch, seqlen, nheads, head_dim) view into a
// dense fp32 tile, e4m3 codes times their row's scale. Only rows inside the sequence are
// read.
void load_tile(const TensorView& t, std::int64_t b, std::int64_t s0, std::int64_t rows, std::int64_t h, std::int64_t d,
               float* tile, const RowScale& scale = {}) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t base = element(t, b, s0 + r, h, 0);
    const float row_scale = scale(s0 + r);
    for (std::int64_t c = 0; c < d; ++c) {
      tile[r * d + c] = numeric::load_as_float(t.data, base + c * t.stride[3], t.dtype) * row_scale;
    }
  }
}

// The keys any row of a query block may see lie in [first, last]: the mask's
// first_key and last_key never decrease with the row, so the range runs from the
// block's first row's first key to its last row's last key. Key blocks outside it
// are fully masked for the whole query block and are skipped.
struct KeyRange {
  std::int64_t first, last;
  bool empty() const { return first > last; }
};

KeyRange block_keys(const Problem& p, const QueryBlock& blk) {
  return {p.first_key(blk.row0), p.last_key(blk.row0 + blk.rows - 1)};
}

// A key block needs per-element masking unless every row of the query block sees all of it.
bool needs_mask(const Problem& p, const QueryBlock& blk, std::int64_t n0, std::int64_t cols) {
  return p.first_key(blk.row0 + blk.rows - 1) > n0 || p.last_key(blk.row0) < n0 + cols - 1;
}

// S = Q K^T for one key block, in log2 units (see ScoreMap); masked entries become -inf.
void compute_scores(const Problem& p, const QueryBlock& blk, const ScoreMap& map, std::int64_t n0, std::int64_t cols,
                    Tiles& t) {
  const bool mask = needs_mask(p, blk, n0, cols);
  const std::int64_t d = t.head_dim;
  for (std::int64_t r = 0; r < blk.rows; ++r) {
    const float* q = &t.q[r * d];
    float* s = &t.s[r * t.block_n];
    for (std::int64_t c = 0; c < cols; ++c) {
      if (mask && !p.visible(blk.row0 + r, n0 + c)) {
        s[c] = kNegInf;
        continue;
      }
      const float* k = &t.k[c * d];
      float raw = 0.f;
      for (std::int64_t e = 0; e < d; ++e) raw += q[e] * k[e];
      s[c] = map(raw);
    }
  }
}

// FP8 calls round the weights P V reads to e4m3, as the FP8 kernel's second MMA takes
// them, after a shift by 2^8 that moves P from [0, 1] to [0, 256] (fa3/attention.h):
// e4m3 then resolves weights down to 2^-17 instead of 2^-10. The shift is a power of
// two, so scaling back is exact and the result is the rounded weight itself.
constexpr float kFp8PShift = 256.f;

float fp8_weight(float p) { return numeric::round_to_e4m3(p * kFp8PShift) * (1.f / kFp8PShift); }

// The online softmax step for one key block: raise each row's running max, rescale
// what was accumulated under the old max, turn scores into weights and add P V.
// A row whose max is still -inf (nothing visible yet) uses 0 as its reference so
// that exp2(-inf - -inf) never produces NaN: its weights and rescale factor are 0.
// With `fp8_p`, the sum adds the fp32 weights and P V the e4m3-rounded ones.
void online_softmax_step(std::int64_t rows, std::int64_t cols, bool fp8_p, Tiles& t) {
  const std::int64_t d = t.head_dim_v;
  for (std::int64_t r = 0; r < rows; ++r) {
    float* s = &t.s[r * t.block_n];
    const float old_max = t.row_max[r];
    const float new_max = std::max(old_max, *std::max_element(s, s + cols));
    const float ref = new_max == kNegInf ? 0.f : new_max;
    const float rescale = std::exp2(old_max - ref);
    float sum = 0.f;
    for (std::int64_t c = 0; c < cols; ++c) {
      s[c] = std::exp2(s[c] - ref);
      sum += s[c];
      if (fp8_p) s[c] = fp8_weight(s[c]);
    }
    t.row_max[r] = new_max;
    t.row_sum[r] = t.row_sum[r] * rescale + sum;

    // For 16-bit inputs P stays fp32 here; the GPU kernel rounds it to the input dtype
    // for its second MMA, which the CPU path has no reason to copy. For e4m3 inputs the
    // rounding is the FP8 numerics the CPU path is the oracle of, so it copies it.
    float* acc = &t.acc[r * d];
    for (std::int64_t e = 0; e < d; ++e) acc[e] *= rescale;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float* v = &t.v[c * d];
      for (std::int64_t e = 0; e < d; ++e) acc[e] += s[c] * v[e];
    }
  }
}

// The sink of query head `head` in log2 units, like the scores (see ScoreMap); -inf
// without sinks.
float sink_log2(const ForwardArgs& a, std::int64_t head) {
  if (!a.sinks.defined()) return kNegInf;
  return static_cast<const float*>(a.sinks.data)[head * a.sinks.stride[0]] * kLog2e;
}

// The sink joins each row once, here, as a last key whose score is `sink` (log2 units)
// and whose value is 0: the row's max rises to it if need be, what was summed under the
// old max is rescaled, and the sink's weight adds to the sum but not to acc. Without
// sinks (-inf) the rescale is exactly 1 (or 0 for a row that saw no key) and the weight
// 0, so the results are bitwise those of no sink step at all. Then out = acc / sum and
// lse = (max + log2(sum)) * ln 2; a row with neither a key nor a sink gets out 0 and
// lse -inf, one with only a sink out 0 and lse the sink (to fp32 rounding).
void store_block(const ForwardArgs& a, const QueryBlock& blk, float sink, const Tiles& t) {
  const std::int64_t d = t.head_dim_v;
  const bool has_lse = a.lse.data != nullptr;
  for (std::int64_t r = 0; r < blk.rows; ++r) {
    const float max = std::max(t.row_max[r], sink);
    const float ref = max == kNegInf ? 0.f : max;
    const float rescale = std::exp2(t.row_max[r] - ref);
    const float sum = t.row_sum[r] * rescale + std::exp2(sink - ref);
    const bool empty = sum == 0.f;
    const float inv_sum = empty ? 0.f : rescale / sum;
    const std::int64_t base = element(a.out, blk.batch, blk.row0 + r, blk.head, 0);
    for (std::int64_t e = 0; e < d; ++e) {
      numeric::store_from_float(a.out.data, base + e * a.out.stride[3], a.out.dtype, t.acc[r * d + e] * inv_sum);
    }
    if (has_lse) {
      const float lse = empty ? kNegInf : (max + std::log2(sum)) * kLn2;
      const std::int64_t at =
          blk.batch * a.lse.stride[0] + blk.head * a.lse.stride[1] + (blk.row0 + r) * a.lse.stride[2];
      static_cast<float*>(a.lse.data)[at] = lse;
    }
  }
}

void run_block(const Problem& p, const ForwardArgs& a, const ScoreMap& map, const QueryBlock& blk, Tiles& t) {
  const std::int64_t d = p.head_dim;
  const std::int64_t kv_head = blk.head / p.group_size();
  const bool fp8 = a.q.dtype == DType::kFloat8E4M3;
  const Fp8Args& f = a.fp8;
  const RowScale q_scale =
      fp8 ? RowScale(f.q_descale, f.q_block_scale, f.block_rows, blk.batch, kv_head, blk.head) : RowScale();
  const RowScale k_scale =
      fp8 ? RowScale(f.k_descale, f.k_block_scale, f.block_rows, blk.batch, kv_head, kv_head) : RowScale();
  const RowScale v_scale =
      fp8 ? RowScale(f.v_descale, f.v_block_scale, f.block_rows, blk.batch, kv_head, kv_head) : RowScale();
  load_tile(a.q, blk.batch, blk.row0, blk.rows, blk.head, d, t.q.data(), q_scale);
  std::fill(t.acc.begin(), t.acc.end(), 0.f);
  std::fill(t.row_max.begin(), t.row_max.end(), kNegInf);
  std::fill(t.row_sum.begin(), t.row_sum.end(), 0.f);

  const KeyRange keys = block_keys(p, blk);
  if (!keys.empty()) {
    const std::int64_t bn = t.block_n;
    for (std::int64_t nb = keys.first / bn; nb <= keys.last / bn; ++nb) {
      const std::int64_t n0 = nb * bn;
      const std::int64_t cols = std::min(bn, p.seqlen_k - n0);
      load_tile(a.k, blk.batch, n0, cols, kv_head, d, t.k.data(), k_scale);
      load_tile(a.v, blk.batch, n0, cols, kv_head, p.head_dim_v, t.v.data(), v_scale);
      compute_scores(p, blk, map, n0, cols, t);
      online_softmax_step(blk.rows, cols, fp8, t);
    }
  }
  store_block(a, blk, sink_log2(a, blk.head), t);
}

// Work items are numbered so that the last query blocks come first: under a causal
// mask they see the most keys, and starting with them balances the threads' load.
QueryBlock work_item(const Problem& p, std::int64_t block_m, std::int64_t item) {
  const std::int64_t heads = p.batch * p.nheads_q;
  const std::int64_t m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  const std::int64_t mb = m_blocks - 1 - item / heads;
  const std::int64_t bh = item % heads;
  QueryBlock blk;
  blk.batch = bh / p.nheads_q;
  blk.head = bh % p.nheads_q;
  blk.row0 = mb * block_m;
  blk.rows = std::min(block_m, p.seqlen_q - blk.row0);
  return blk;
}

int thread_count(const TiledCpuConfig& config, std::int64_t items) {
  const std::int64_t n = config.num_threads > 0 ? static_cast<std::int64_t>(config.num_threads)
                                                : static_cast<std::int64_t>(std::thread::hardware_concurrency());
  return static_cast<int>(std::clamp<std::int64_t>(n, 1, std::max<std::int64_t>(items, 1)));
}

// The global work item numbering: task t's items are [first_item[t], first_item[t + 1]).
std::vector<std::int64_t> first_items(const std::vector<TiledTask>& tasks, std::int64_t block_m) {
  std::vector<std::int64_t> first{0};
  for (const TiledTask& task : tasks) {
    const Problem& p = task.problem;
    const std::int64_t m_blocks = (p.seqlen_q + block_m - 1) / block_m;
    first.push_back(first.back() + p.batch * p.nheads_q * m_blocks);
  }
  return first;
}

}  // namespace

void tiled_forward(const Problem& p, const ForwardArgs& args, const TiledCpuConfig& config) {
  tiled_forward(std::vector<TiledTask>{{p, args}}, config);
}

void tiled_forward(const std::vector<TiledTask>& tasks, const TiledCpuConfig& config) {
  if (config.block_m < 1 || config.block_n < 1 || config.num_threads < 0) {
    throw std::invalid_argument("tiled_forward: block_m and block_n must be >= 1 and num_threads >= 0");
  }
  const std::vector<std::int64_t> first = first_items(tasks, config.block_m);
  const std::int64_t items = first.back();
  if (items == 0) return;
  std::vector<ScoreMap> maps;
  maps.reserve(tasks.size());
  for (const TiledTask& task : tasks) maps.emplace_back(task.problem);
  const Problem& dims = tasks.front().problem;

  std::atomic<std::int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto worker = [&] {
    try {
      Tiles tiles(config.block_m, config.block_n, dims.head_dim, dims.head_dim_v);
      for (std::int64_t item = next++; item < items; item = next++) {
        const auto t = static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), item) - first.begin() - 1);
        const Problem& p = tasks[t].problem;
        run_block(p, tasks[t].args, maps[t], work_item(p, config.block_m, item - first[t]), tiles);
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = items;  // the others stop after their current item
    }
  };

  // The calling thread works too; if the system refuses more threads, fewer do the work.
  const int threads = thread_count(config, items);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads - 1));  // so that only starting a thread can fail below
  for (int i = 1; i < threads; ++i) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  worker();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fa3::reference
