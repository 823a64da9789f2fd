// The mask policies (hopper/mask.cuh), checked on the host against their definition:
// the causal / sequence-end column bits for every bound and fragment width the kernels
// use (a wrong bit would show on the GPU only for rows whose bound falls on that
// column), the key blocks a range of query rows needs (too few would drop keys, too
// many would leave a warpgroup computing blocks it could skip), and the query blocks
// the backward's tile of a key block walks (too late a start drops gradients). The
// general policy (windows, chunks) is checked pair by pair against Problem::visible, the
// definition the references use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "api/problem.h"
#include "hopper/fwd_params.h"
#include "hopper/mask.cuh"
#include "hopper/mask_kind.h"

namespace fa3::hopper {
namespace {

template <class Bits, int kPairs>
void expect_matches_definition() {
  for (int end = -20; end <= 8 * kPairs + 20; ++end) {
    const Bits bits = visible_columns<Bits, kPairs>(end);
    for (int c = 0; c < static_cast<int>(8 * sizeof(Bits)); ++c) {
      const bool exists = c < 2 * kPairs;
      const bool visible = exists && (c % 2) + 8 * (c / 2) < end;
      EXPECT_EQ(static_cast<bool>((bits >> c) & 1), visible) << "pairs " << kPairs << " end " << end << " bit " << c;
    }
  }
}

TEST(MaskColumns, MatchDefinitionForEveryBound) {
  expect_matches_definition<std::uint32_t, 16>();  // 128-key blocks
  expect_matches_definition<std::uint32_t, 12>();  // 96
  expect_matches_definition<std::uint32_t, 10>();  // 80
  expect_matches_definition<std::uint32_t, 8>();   // 64
  expect_matches_definition<std::uint64_t, 22>();  // 176
  expect_matches_definition<std::uint64_t, 32>();  // 256
}

// The key blocks rows [begin, begin + rows) need: up to the furthest key any existing
// row sees, from the policy's visible_end.
template <int kBlockN, class Mask>
int key_blocks_by_definition(const Mask& mask, int seqlen_q, int begin, int rows) {
  int end = 0;
  for (int row = begin; row < std::min(begin + rows, seqlen_q); ++row) end = std::max(end, mask.visible_end(row));
  return (end + kBlockN - 1) / kBlockN;
}

template <int kBlockN, class Mask>
void expect_key_blocks_match_definition() {
  const int lens[][2] = {{1, 1},     {3, 17},    {17, 3},     {64, 64},     {127, 129}, {128, 128}, {129, 127},
                         {239, 799}, {799, 239}, {1000, 1000}, {1024, 1023}, {1025, 1},  {1, 1025}};
  for (const auto& len : lens) {
    FwdParams p{};
    p.seqlen_q = len[0];
    p.seqlen_k = len[1];
    const Mask mask(p);
    for (int rows : {64, 128, 192}) {
      for (int begin = 0; begin < p.seqlen_q + 192; begin += 64) {
        EXPECT_EQ(mask.template key_blocks<kBlockN>(begin, begin + rows),
                  key_blocks_by_definition<kBlockN>(mask, p.seqlen_q, begin, rows))
            << (Mask::kCausal ? "causal" : "no mask") << " sq " << p.seqlen_q << " sk " << p.seqlen_k << " rows ["
            << begin << ", " << begin + rows << ") block " << kBlockN;
      }
    }
  }
}

TEST(MaskKeyBlocks, MatchDefinitionForRowRanges) {
  expect_key_blocks_match_definition<128, CausalMask>();
  expect_key_blocks_match_definition<80, CausalMask>();
  expect_key_blocks_match_definition<96, CausalMask>();
  expect_key_blocks_match_definition<128, NoMask>();
  expect_key_blocks_match_definition<80, NoMask>();
}

// The backward's tile of key block n walks query blocks [begin, end): every block with
// a row that sees one of its keys, and (begin) none before the first such block.
template <int kBlockM, int kBlockN, class Mask>
void expect_query_blocks_match_definition() {
  const int lens[][2] = {{1, 1},     {3, 17},    {17, 3},     {64, 64},     {127, 129}, {128, 128}, {129, 127},
                         {239, 799}, {799, 239}, {1000, 1000}, {1024, 1023}, {1025, 1},  {1, 1025}};
  for (const auto& len : lens) {
    FwdParams p{};
    p.seqlen_q = len[0];
    p.seqlen_k = len[1];
    const Mask mask(p);
    for (int n = 0; n * kBlockN < p.seqlen_k; ++n) {
      int first_seen = -1;
      for (int row = 0; row < p.seqlen_q && first_seen < 0; ++row) {
        if (mask.visible_end(row) > n * kBlockN) first_seen = row;
      }
      int begin = -1;
      const int end = mask.template query_blocks<kBlockM, kBlockN>(n, &begin);
      EXPECT_EQ(end, (p.seqlen_q + kBlockM - 1) / kBlockM);
      // With a bottom-right aligned causal mask some row sees every key; were there a key
      // block no row sees, its tile would have nothing to add wherever it started.
      ASSERT_GE(first_seen, 0);
      EXPECT_EQ(begin, first_seen / kBlockM) << (Mask::kCausal ? "causal" : "no mask") << " sq " << p.seqlen_q
                                             << " sk " << p.seqlen_k << " key block " << n << " of " << kBlockN;
    }
  }
}

TEST(MaskQueryBlocks, MatchDefinitionForKeyBlocks) {
  expect_query_blocks_match_definition<64, 128, CausalMask>();
  expect_query_blocks_match_definition<128, 128, CausalMask>();
  expect_query_blocks_match_definition<64, 80, CausalMask>();
  expect_query_blocks_match_definition<64, 96, CausalMask>();
  expect_query_blocks_match_definition<64, 128, NoMask>();
  expect_query_blocks_match_definition<64, 80, NoMask>();
}

// A problem's mask fields and the kernel parameters set_mask_params resolves from them.
std::pair<Problem, FwdParams> resolved_mask(int seqlen_q, int seqlen_k, int left, int right, int chunk) {
  Problem pr;
  pr.seqlen_q = seqlen_q;
  pr.seqlen_k = seqlen_k;
  pr.window_left = left;
  pr.window_right = right;
  pr.chunk = chunk;
  FwdParams p{};
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.softmax_scale = 0.125f;
  set_mask_params(pr, &p);
  return {pr, p};
}

// The general policy for one window and chunk, with the parameters the dispatcher
// gives the kernels, against Problem::visible: every block range covers each visible
// (row, key) pair and starts and ends at a block holding one; a tile left unmasked has
// every pair visible; each row's visible range is exact, and each key's range of rows
// names the same pairs; and the forward's key ranges and the backward's query ranges
// name the same (query block, key block) pairs, which deterministic dQ turns count on.
template <int kBlockM, int kBlockN>
void expect_general_matches_definition(int seqlen_q, int seqlen_k, int left, int right, int chunk = 0) {
  const auto [pr, p] = resolved_mask(seqlen_q, seqlen_k, left, right, chunk);
  const GeneralMask mask(p);
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  const auto seen = [&](int m, int n) {  // some pair of the tile is visible
    for (int i = m * kBlockM; i < std::min((m + 1) * kBlockM, seqlen_q); ++i) {
      for (int j = n * kBlockN; j < std::min((n + 1) * kBlockN, seqlen_k); ++j) {
        if (pr.visible(i, j)) return true;
      }
    }
    return false;
  };
  // A block range [begin, end) of `what` `index` is tight: from the first block in
  // [0, count) with a visible pair to one past the last; empty when there is none.
  const auto expect_tight = [](int begin, int end, int count, auto&& has_pair, const char* what, int index) {
    int first = -1, last = -1;
    for (int b = 0; b < count; ++b) {
      if (!has_pair(b)) continue;
      if (first < 0) first = b;
      last = b;
    }
    if (first < 0) {
      EXPECT_LE(end, begin) << what << " " << index << " has no visible pair";
    } else {
      EXPECT_EQ(begin, first) << what << " " << index;
      EXPECT_EQ(end, last + 1) << what << " " << index;
    }
  };
  SCOPED_TRACE(testing::Message() << "sq " << seqlen_q << " sk " << seqlen_k << " window (" << left << ", " << right
                                  << ") chunk " << chunk << " blocks " << kBlockM << "x" << kBlockN);
  for (int i = 0; i < seqlen_q; ++i) {
    if (pr.first_key(i) > pr.last_key(i)) continue;  // a row without keys: its bounds cross
    ASSERT_EQ(std::max(mask.visible_begin(i), 0), pr.first_key(i)) << "row " << i;
    ASSERT_EQ(mask.visible_end(i), pr.last_key(i) + 1) << "row " << i;
  }
  // Key by key (the backward's transposed tiles) the same pairs as row by row, also for
  // the rows and keys past the sequences' ends that the last blocks hold.
  for (int j = 0; j < n_blocks * kBlockN; ++j) {
    for (int i = 0; i < m_blocks * kBlockM; ++i) {
      const bool by_row = mask.visible_begin(i) <= j && j < mask.visible_end(i);
      const bool by_key = mask.seen_begin(j) <= i && i < mask.seen_end(j);
      ASSERT_EQ(by_key, by_row) << "row " << i << ", key " << j;
    }
  }
  for (int m = 0; m < m_blocks; ++m) {
    const int begin = mask.n_block_begin<kBlockM, kBlockN>(m);
    const int end = mask.n_block_end<kBlockM, kBlockN>(m);
    expect_tight(begin, end, n_blocks, [&](int n) { return seen(m, n); }, "query block", m);
    for (int n = begin; n < end; ++n) {
      if (mask.needs_mask<kBlockM, kBlockN>(m, n)) continue;
      for (int i = m * kBlockM; i < std::min((m + 1) * kBlockM, seqlen_q); ++i) {
        for (int j = n * kBlockN; j < (n + 1) * kBlockN; ++j) {
          ASSERT_TRUE(j < seqlen_k && pr.visible(i, j))
              << "unmasked tile " << m << "," << n << " hides (" << i << ", " << j << ")";
        }
      }
    }
  }
  for (int n = 0; n < n_blocks; ++n) {
    int begin = -1;
    const int end = mask.query_blocks<kBlockM, kBlockN>(n, &begin);
    expect_tight(begin, end, m_blocks, [&](int m) { return seen(m, n); }, "key block", n);
    for (int m = 0; m < m_blocks; ++m) {
      const bool backward = begin <= m && m < end;
      const bool forward = mask.n_block_begin<kBlockM, kBlockN>(m) <= n && n < mask.n_block_end<kBlockM, kBlockN>(m);
      ASSERT_EQ(forward, backward) << "query block " << m << ", key block " << n;
    }
  }
}

TEST(GeneralMask, MatchesDefinitionForWindows) {
  const int lens[][2] = {{1, 1}, {3, 17}, {17, 3}, {127, 129}, {239, 799}, {799, 239}, {1000, 1000}, {1025, 1}};
  const int windows[][2] = {{-1, -1}, {0, 0}, {100, 37}, {200, -1}, {-1, 60}, {130, 0}, {5000, 5000}, {1, 300}};
  for (const auto& len : lens) {
    for (const auto& w : windows) {
      expect_general_matches_definition<128, 128>(len[0], len[1], w[0], w[1]);
      expect_general_matches_definition<64, 128>(len[0], len[1], w[0], w[1]);
      expect_general_matches_definition<64, 80>(len[0], len[1], w[0], w[1]);
      expect_general_matches_definition<192, 128>(len[0], len[1], w[0], w[1]);
    }
  }
}

// Chunks alone, causal and under windows (one crossing chunk edges, the diagonal only):
// shorter than a block (48), longer but not a multiple of one (200), a block (128), one
// key (the diagonal, as a window), odd (7), and longer than the keys; with more queries
// than keys, the first queries' chunks hold no key.
TEST(GeneralMask, MatchesDefinitionForChunks) {
  const int lens[][2] = {{1, 1},     {3, 17},    {17, 3},   {127, 129}, {239, 799},
                         {799, 239}, {600, 600}, {1025, 1}, {1, 1025}};
  const int windows[][2] = {{-1, -1}, {-1, 0}, {100, 37}, {0, 0}, {130, 0}};
  for (const auto& len : lens) {
    for (const auto& w : windows) {
      for (int chunk : {48, 200, 128, 1, 7, 5000}) {
        expect_general_matches_definition<128, 128>(len[0], len[1], w[0], w[1], chunk);
        expect_general_matches_definition<64, 128>(len[0], len[1], w[0], w[1], chunk);
        expect_general_matches_definition<64, 80>(len[0], len[1], w[0], w[1], chunk);
        expect_general_matches_definition<192, 128>(len[0], len[1], w[0], w[1], chunk);
      }
    }
  }
}

// Chunks of whole tiles: a query block visits the two key blocks of its chunk, and no
// tile needs element-wise masking; the same for the backward's query blocks.
TEST(GeneralMask, MasksNoTileInsideOneChunk) {
  Problem pr;
  pr.seqlen_q = 1024;
  pr.seqlen_k = 1024;
  pr.chunk = 256;
  FwdParams p{};
  p.seqlen_q = 1024;
  p.seqlen_k = 1024;
  set_mask_params(pr, &p);
  const GeneralMask mask(p);
  for (int b = 0; b < 8; ++b) {
    EXPECT_EQ((mask.n_block_begin<128, 128>(b)), b / 2 * 2);
    EXPECT_EQ((mask.n_block_end<128, 128>(b)), b / 2 * 2 + 2);
    int begin = -1;
    EXPECT_EQ((mask.query_blocks<128, 128>(b, &begin)), b / 2 * 2 + 2);
    EXPECT_EQ(begin, b / 2 * 2);
    for (int n = b / 2 * 2; n < b / 2 * 2 + 2; ++n) EXPECT_FALSE((mask.needs_mask<128, 128>(b, n))) << b << ", " << n;
  }
}

// The kernels divide positions by the chunk with a multiply and a shift
// (set_mask_params): exact for every position from 0 to 2^31 - 1, checked at the edges
// of chunks and of the range for short and long chunks; positions before key 0 fall in
// the chunk [-chunk, 0), which holds no key.
TEST(GeneralMask, ChunkStartDividesExactly) {
  const int big = 2147483647;
  std::vector<int> chunks;
  for (int c = 2; c <= 300; ++c) chunks.push_back(c);
  for (int c : {1000, 4096, 8191, 8192, 8193, 65537, 1 << 20, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, big - 1, big}) {
    chunks.push_back(c);
  }
  for (int c : chunks) {
    Problem pr;
    pr.seqlen_q = big;
    pr.seqlen_k = big;
    pr.chunk = c;
    FwdParams p{};
    p.seqlen_q = big;
    p.seqlen_k = big;
    set_mask_params(pr, &p);
    ASSERT_EQ(p.chunk, c);
    const GeneralMask mask(p);
    const auto expect_exact = [&](std::int64_t pos) {
      if (pos < 0 || pos > big) return;
      ASSERT_EQ(mask.chunk_start(static_cast<int>(pos)), pos / c * c) << "chunk " << c << " position " << pos;
    };
    for (std::int64_t pos = 0; pos < 4 * c && pos < 2000; ++pos) expect_exact(pos);
    for (std::int64_t k : {std::int64_t{1}, std::int64_t{2}, std::int64_t{big} / c - 1, std::int64_t{big} / c}) {
      for (std::int64_t d = -2; d <= 2; ++d) expect_exact(k * c + d);
    }
    for (std::int64_t pos = big; pos > big - 1000; --pos) expect_exact(pos);
    std::uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(c);
    for (int i = 0; i < 2000; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      expect_exact(static_cast<std::int64_t>(x % (static_cast<std::uint64_t>(big) + 1)));
    }
    for (int pos : {-1, -2, -c, -big}) EXPECT_EQ(mask.chunk_start(pos), -c) << "chunk " << c;
  }
}

// What the dispatcher hands the general kernels: windows and chunks clamped to the
// sequences, an unbounded side as the sequence's length, and a chunk of one key as the
// diagonal window.
TEST(GeneralMask, ParamsFromProblem) {
  Problem pr;
  pr.seqlen_q = 100;
  pr.seqlen_k = 300;
  pr.window_left = 5000;
  pr.window_right = 5000;
  pr.chunk = 5000;
  FwdParams p{};
  set_mask_params(pr, &p);
  EXPECT_EQ(p.window_left, 300);
  EXPECT_EQ(p.window_right, 100);
  EXPECT_EQ(p.chunk, 300);
  pr.chunk = 1;
  set_mask_params(pr, &p);
  EXPECT_EQ(p.window_left, 0);
  EXPECT_EQ(p.window_right, 0);
  EXPECT_EQ(p.chunk, 0);
  pr = Problem{};
  pr.seqlen_q = 10;
  pr.seqlen_k = 10;
  set_mask_params(pr, &p);
  EXPECT_EQ(p.window_left, 10);
  EXPECT_EQ(p.window_right, 10);
  EXPECT_EQ(p.chunk, 0);
  pr.seqlen_q = 7;
  pr.window_right = 0;
  set_mask_params(pr, &p);
  EXPECT_EQ(p.window_left, 10);
  EXPECT_EQ(p.window_right, 0);
}

// Which family runs a problem: plain and causal keep their kernels, whatever else a
// window, chunk, softcap or sinks ask for goes to the general ones.
TEST(MaskKind, FollowsWindowChunkAndSoftcap) {
  Problem p;
  EXPECT_EQ(mask_kind(p), MaskKind::kPlain);
  p.window_right = 0;
  EXPECT_EQ(mask_kind(p), MaskKind::kCausal);  // (-1, 0) is causal, asked for or not
  p.causal = true;
  EXPECT_EQ(mask_kind(p), MaskKind::kCausal);
  p.window_left = 64;
  EXPECT_EQ(mask_kind(p), MaskKind::kGeneral);
  p = Problem{};
  p.window_right = 5;
  EXPECT_EQ(mask_kind(p), MaskKind::kGeneral);
  // Sinks need no family of their own: the plain and causal kernels fold them in.
  p = Problem{};
  p.has_sinks = true;
  EXPECT_EQ(mask_kind(p), MaskKind::kPlain);
  p.window_right = 0;
  EXPECT_EQ(mask_kind(p), MaskKind::kCausal);
  p = Problem{};
  p.chunk = 8192;
  EXPECT_EQ(mask_kind(p), MaskKind::kGeneral);
  p.causal = true;
  p.window_right = 0;
  EXPECT_EQ(mask_kind(p), MaskKind::kGeneral);
  p = Problem{};
  p.softcap = 30.f;
  EXPECT_EQ(mask_kind(p), MaskKind::kGeneral);
  p.causal = true;
  p.window_right = 0;
  EXPECT_EQ(mask_kind(p), MaskKind::kGeneral);
  for (MaskKind k : {MaskKind::kPlain, MaskKind::kCausal, MaskKind::kGeneral}) {
    EXPECT_EQ(mask_kind_from_name(mask_kind_name(k)), k);
  }
}

// A varlen call's kernels build each policy once from the call's parameters (max_seqlen_q
// and max_seqlen_k, the window and chunk resolved for them) and give it each sequence's
// lengths (for_sequence): every row of every shorter sequence must then see exactly the
// keys its own fixed-length call would.
template <class Mask>
void expect_for_sequence_matches_own_call(int max_q, int max_k, int left, int right, int chunk) {
  const auto resolved = [&](int sq, int sk) { return resolved_mask(sq, sk, left, right, chunk); };
  const Mask call_mask(resolved(max_q, max_k).second);
  const int lens[][2] = {{1, 1}, {0, 5}, {5, 0}, {3, 17}, {17, 3}, {64, 64}, {127, 129}, {129, 127}, {1, max_k}};
  for (const auto& len : lens) {
    const int sq = std::min(len[0], max_q), sk = std::min(len[1], max_k);
    const auto [own, own_params] = resolved(sq, sk);
    const Mask mask = for_sequence(call_mask, sq, sk);
    const Mask own_mask(own_params);
    for (int row = 0; row < sq; ++row) {
      for (int key = 0; key < sk; ++key) {
        bool visible = key < mask.visible_end(row);
        if constexpr (Mask::kGeneral) visible = visible && key >= mask.visible_begin(row);
        ASSERT_EQ(visible, own.visible(row, key))
            << "max (" << max_q << ", " << max_k << ") sequence (" << sq << ", " << sk << ") window (" << left << ", "
            << right << ") chunk " << chunk << " row " << row << " key " << key;
      }
      EXPECT_EQ(mask.template key_blocks<64>(row, row + 1), own_mask.template key_blocks<64>(row, row + 1));
    }
    EXPECT_EQ(mask.template key_blocks<64>(sq, sq + 64), 0) << "rows past the sequence need no key";
  }
}

TEST(MaskForSequence, EverySequenceSeesWhatItsOwnCallWould) {
  expect_for_sequence_matches_own_call<NoMask>(300, 400, -1, -1, 0);
  expect_for_sequence_matches_own_call<CausalMask>(300, 400, -1, 0, 0);
  expect_for_sequence_matches_own_call<CausalMask>(400, 200, -1, 0, 0);
  for (const auto& [left, right, chunk] : std::vector<std::tuple<int, int, int>>{
           {100, 30, 0}, {-1, 0, 48}, {7, 0, 0}, {0, 0, 0}, {-1, -1, 96}, {5000, 5000, 0}, {-1, 3, 1}, {20, -1, 500}}) {
    expect_for_sequence_matches_own_call<GeneralMask>(300, 400, left, right, chunk);
    expect_for_sequence_matches_own_call<GeneralMask>(400, 150, left, right, chunk);
  }
}

}  // namespace
}  // namespace fa3::hopper
