#include "grad_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "common/numeric.h"

namespace fa3::cli {
namespace {

using reference::RowRef;

// Row (b, s, h, :) of a (batch, seqlen, nheads, head_dim) view, exactly, in fp64.
void load_row(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, double* dst) {
  const std::int64_t base = b * t.stride[0] + s * t.stride[1] + h * t.stride[2];
  for (std::int64_t c = 0; c < t.shape[3]; ++c) {
    dst[c] = numeric::load_as_float(t.data, base + c * t.stride[3], t.dtype);
  }
}

// Every row of one (batch, head) of a view, converted once and contiguous.
class HeadRows {
 public:
  HeadRows(const TensorView& t, std::int64_t batch, std::int64_t head)
      : dim_(t.shape[3]), data_(static_cast<std::size_t>(t.shape[1] * t.shape[3])) {
    for (std::int64_t s = 0; s < t.shape[1]; ++s) {
      load_row(t, batch, s, head, &data_[static_cast<std::size_t>(s * dim_)]);
    }
  }
  const double* row(std::int64_t s) const { return &data_[static_cast<std::size_t>(s * dim_)]; }

 private:
  std::int64_t dim_;
  std::vector<double> data_;
};

// a . b over eight partial sums held as four pairs (the GCC/Clang vector extension): an
// addition does not wait on the one before, and each pair is one vector instruction,
// where a plain loop, which the compiler may not reorder, waits on every addition.
// q . k runs over q's head dim and dout . v over v's, which may differ.
double dot(const double* a, const double* b, std::int64_t n) {
  using Pair = double __attribute__((vector_size(16)));
  Pair s0 = {0, 0}, s1 = {0, 0}, s2 = {0, 0}, s3 = {0, 0};
  auto load = [](const double* p) {
    Pair x;
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  std::int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    s0 += load(a + c) * load(b + c);
    s1 += load(a + c + 2) * load(b + c + 2);
    s2 += load(a + c + 4) * load(b + c + 4);
    s3 += load(a + c + 6) * load(b + c + 6);
  }
  for (; c + 2 <= n; c += 2) s0 += load(a + c) * load(b + c);
  double sum = ((s0[0] + s1[0]) + (s2[0] + s3[0])) + ((s0[1] + s1[1]) + (s2[1] + s3[1]));
  for (; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

// One query row against every key it sees: its q and dout, its scores and dP, and
// the statistics lse and D. Reused from row to row, so that its buffers are allocated
// once per worker.
struct RowPass {
  std::int64_t first = 0;
  std::int64_t last = -1;
  double sink = 0;  // the head's sink logit; -inf without sinks
  std::vector<double> q, dout;  // of q's head dim and of v's
  std::vector<double> score;  // after scale and softcap, for key first + n
  std::vector<double> slope;  // d score / d(q . k)
  std::vector<double> dp;
  double lse = 0;
  double delta = 0;

  bool sees(std::int64_t j) const { return j >= first && j <= last; }
  double prob(std::int64_t j) const { return std::exp(score[j - first] - lse); }
  double ds(std::int64_t j) const { return prob(j) * (dp[j - first] - delta) * slope[j - first]; }

  // Loads query row `i` of query head `h` and sizes the buffers for its keys.
  void start(const Problem& p, const BackwardArgs& a, std::int64_t batch, std::int64_t h, std::int64_t i) {
    first = p.first_key(i);
    last = p.last_key(i);
    sink = a.sinks.defined() ? static_cast<const float*>(a.sinks.data)[h * a.sinks.stride[0]]
                             : -std::numeric_limits<double>::infinity();
    q.resize(static_cast<std::size_t>(p.head_dim));
    dout.resize(static_cast<std::size_t>(p.head_dim_v));
    load_row(a.q, batch, i, h, q.data());
    load_row(a.dout, batch, i, h, dout.data());
    const std::size_t n = static_cast<std::size_t>(std::max<std::int64_t>(0, last - first + 1));
    score.resize(n);
    slope.resize(n);
    dp.resize(n);
  }

  // Key j's score and dP, j in [first, last].
  void add_key(const Problem& p, std::int64_t j, const double* k, const double* v) {
    const std::size_t m = static_cast<std::size_t>(j - first);
    const double qk = dot(q.data(), k, p.head_dim);
    dp[m] = dot(dout.data(), v, p.head_dim_v);
    const double scale = p.softmax_scale;
    score[m] = qk * scale;
    slope[m] = scale;
    if (p.softcap > 0) {
      const double cap = p.softcap;
      const double t = std::tanh(score[m] / cap);
      score[m] = cap * t;
      slope[m] = scale * (1 - t * t);
    }
  }

  // lse and D, once every key is in. The sink joins the max and the sum (its weight is
  // exactly 0 without sinks) but not D: it has no value.
  void finish() {
    if (score.empty()) return;
    const double max = std::max(sink, *std::max_element(score.begin(), score.end()));
    double sum = std::exp(sink - max);
    double weighted = 0;  // sum of exp(score - max) * dP: D before normalisation
    for (std::size_t m = 0; m < score.size(); ++m) {
      const double e = std::exp(score[m] - max);
      sum += e;
      weighted += e * dp[m];
    }
    lse = max + std::log(sum);
    delta = weighted / sum;
  }
};

// Up to kTileRows query rows of one KV group, passed over their keys together: each
// key row is read from memory once per tile rather than once per query row, which
// keeps a long sequence's check from waiting on memory.
constexpr std::int64_t kTileRows = 8;

void run_tile(const Problem& p, const HeadRows& k, const HeadRows& v, RowPass* rows, std::int64_t count) {
  std::int64_t lo = p.seqlen_k, hi = -1;
  for (std::int64_t r = 0; r < count; ++r) {
    if (rows[r].first > rows[r].last) continue;
    lo = std::min(lo, rows[r].first);
    hi = std::max(hi, rows[r].last);
  }
  for (std::int64_t j = lo; j <= hi; ++j) {
    const double* kj = k.row(j);
    const double* vj = v.row(j);
    for (std::int64_t r = 0; r < count; ++r) {
      if (rows[r].sees(j)) rows[r].add_key(p, j, kj, vj);
    }
  }
  for (std::int64_t r = 0; r < count; ++r) rows[r].finish();
}

int worker_count(int threads, std::int64_t items) {
  const int available = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::clamp<std::int64_t>(items, 1, available));
}

// body(item, worker) for every item of [0, count), item i on worker i % workers: a
// fixed split, so that each worker's partial sums, and their total, are reproducible.
void parallel_for(std::int64_t count, int workers, const std::function<void(std::int64_t, int)>& body) {
  auto work = [&](int w) {
    for (std::int64_t i = w; i < count; i += workers) body(i, w);
  };
  if (workers == 1) {
    work(0);
    return;
  }
  std::vector<std::jthread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(work, w);
}

// The (batch, KV head) groups of `rows`, `rows[i].head / group_size` being a row's KV
// head: each group loads its K and V rows once.
std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::size_t>> by_kv_head(const std::vector<RowRef>& rows,
                                                                                     std::int64_t group_size) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::size_t>> groups;
  for (std::size_t r = 0; r < rows.size(); ++r) groups[{rows[r].batch, rows[r].head / group_size}].push_back(r);
  return groups;
}

std::int64_t tile_count(std::size_t rows) { return (static_cast<std::int64_t>(rows) + kTileRows - 1) / kTileRows; }

void query_gradients(const Problem& p, const BackwardArgs& a, const std::vector<RowRef>& rows, int threads,
                     std::vector<double>* dq) {
  const std::size_t d = static_cast<std::size_t>(p.head_dim);
  dq->assign(rows.size() * d, 0.0);
  for (const auto& [group, members] : by_kv_head(rows, p.group_size())) {
    const HeadRows k(a.k, group.first, group.second);
    const HeadRows v(a.v, group.first, group.second);
    const std::int64_t tiles = tile_count(members.size());
    const int workers = worker_count(threads, tiles);
    std::vector<std::vector<RowPass>> passes(static_cast<std::size_t>(workers), std::vector<RowPass>(kTileRows));
    parallel_for(tiles, workers, [&](std::int64_t t, int w) {
      RowPass* tile = passes[static_cast<std::size_t>(w)].data();
      const std::int64_t begin = t * kTileRows;
      const std::int64_t count = std::min<std::int64_t>(kTileRows, static_cast<std::int64_t>(members.size()) - begin);
      for (std::int64_t r = 0; r < count; ++r) {
        const RowRef& row = rows[members[static_cast<std::size_t>(begin + r)]];
        tile[r].start(p, a, row.batch, row.head, row.row);
      }
      run_tile(p, k, v, tile, count);
      for (std::int64_t r = 0; r < count; ++r) {
        double* out = &(*dq)[members[static_cast<std::size_t>(begin + r)] * d];
        for (std::int64_t j = tile[r].first; j <= tile[r].last; ++j) {
          const double ds = tile[r].ds(j);
          const double* kj = k.row(j);
          for (std::size_t c = 0; c < d; ++c) out[c] += ds * kj[c];
        }
      }
    });
  }
}

void key_gradients(const Problem& p, const BackwardArgs& a, const std::vector<RowRef>& keys, int threads,
                   std::vector<double>* dk, std::vector<double>* dv) {
  const std::size_t d = static_cast<std::size_t>(p.head_dim);
  const std::size_t dv_dim = static_cast<std::size_t>(p.head_dim_v);
  dk->assign(keys.size() * d, 0.0);
  dv->assign(keys.size() * dv_dim, 0.0);
  // A key's RowRef names its KV head already: group size 1.
  for (const auto& [group, members] : by_kv_head(keys, 1)) {
    const auto [batch, kv_head] = group;
    const HeadRows k(a.k, batch, kv_head);
    const HeadRows v(a.v, batch, kv_head);
    auto sees_a_member = [&](std::int64_t i) {
      return std::any_of(members.begin(), members.end(), [&](std::size_t r) { return p.visible(i, keys[r].row); });
    };
    // The query rows, of every query head of the group, that see a sampled key.
    std::vector<std::pair<std::int64_t, std::int64_t>> items;
    for (std::int64_t h = kv_head * p.group_size(); h < (kv_head + 1) * p.group_size(); ++h) {
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        if (sees_a_member(i)) items.emplace_back(h, i);
      }
    }
    const std::int64_t tiles = tile_count(items.size());
    const int workers = worker_count(threads, tiles);
    std::vector<std::vector<RowPass>> passes(static_cast<std::size_t>(workers), std::vector<RowPass>(kTileRows));
    // Per worker, dk then dv of each member: summed in worker order after the join.
    const std::size_t stride = d + dv_dim;
    std::vector<std::vector<double>> partial(static_cast<std::size_t>(workers),
                                             std::vector<double>(members.size() * stride, 0.0));
    parallel_for(tiles, workers, [&](std::int64_t t, int w) {
      RowPass* tile = passes[static_cast<std::size_t>(w)].data();
      const std::int64_t begin = t * kTileRows;
      const std::int64_t count = std::min<std::int64_t>(kTileRows, static_cast<std::int64_t>(items.size()) - begin);
      for (std::int64_t r = 0; r < count; ++r) {
        const auto [h, i] = items[static_cast<std::size_t>(begin + r)];
        tile[r].start(p, a, batch, h, i);
      }
      run_tile(p, k, v, tile, count);
      double* sums = partial[static_cast<std::size_t>(w)].data();
      for (std::int64_t r = 0; r < count; ++r) {
        const RowPass& row = tile[r];
        for (std::size_t m = 0; m < members.size(); ++m) {
          const std::int64_t j = keys[members[m]].row;
          if (!row.sees(j)) continue;
          const double prob = row.prob(j);
          const double ds = row.ds(j);
          double* dk_sum = sums + m * stride;
          double* dv_sum = dk_sum + d;
          for (std::size_t c = 0; c < d; ++c) dk_sum[c] += ds * row.q[c];
          for (std::size_t c = 0; c < dv_dim; ++c) dv_sum[c] += prob * row.dout[c];
        }
      }
    });
    for (const std::vector<double>& sums : partial) {
      for (std::size_t m = 0; m < members.size(); ++m) {
        const std::size_t r = members[m];
        for (std::size_t c = 0; c < d; ++c) (*dk)[r * d + c] += sums[m * stride + c];
        for (std::size_t c = 0; c < dv_dim; ++c) (*dv)[r * dv_dim + c] += sums[m * stride + d + c];
      }
    }
  }
}

}  // namespace

GradientRows reference_gradients(const Problem& p, const BackwardArgs& args, const std::vector<RowRef>& query_rows,
                                 const std::vector<RowRef>& key_rows, int threads) {
  GradientRows g;
  query_gradients(p, args, query_rows, threads, &g.dq);
  key_gradients(p, args, key_rows, threads, &g.dk, &g.dv);
  return g;
}

}  // namespace fa3::cli
