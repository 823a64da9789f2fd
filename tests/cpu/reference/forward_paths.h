// Every forward implementation of the CPU side, run on one Attention and returning
// (out, lse) in the reference's canonical layouts, so that a test states a known
// result once and checks it against all of them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fa3/cpu.h"
#include "host_tensor.h"
#include "reference/naive.h"
#include "reference/tiled_cpu.h"

namespace fa3::testing {

struct ForwardPath {
  std::string name;
  std::function<reference::ForwardResult(Attention&)> run;
};

inline std::vector<reference::RowRef> all_rows(const Problem& p) {
  std::vector<reference::RowRef> rows;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.nheads_q; ++h) {
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) rows.push_back({b, h, i});
    }
  }
  return rows;
}

// forward_rows returns rows in the order asked; all_rows asks for them in (b, h, i)
// order, which is the lse layout but not the out layout.
inline reference::ForwardResult rows_to_canonical(const Problem& p, const reference::ForwardResult& r) {
  reference::ForwardResult res{std::vector<double>(r.out.size()), r.lse};
  std::size_t n = 0;
  for (const reference::RowRef& row : all_rows(p)) {
    const std::int64_t at = ((row.batch * p.seqlen_q + row.row) * p.nheads_q + row.head) * p.head_dim_v;
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) res.out[static_cast<std::size_t>(at + d)] = r.out[n++];
  }
  return res;
}

inline reference::ForwardResult written_outputs(const Attention& a) { return {a.out.values(), a.lse.values()}; }

// Small tiles, so that small problems still span several query and key blocks.
inline std::vector<ForwardPath> forward_paths() {
  return {
      {"naive exact",
       [](Attention& a) {
         return reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kExact,
                                   a.sinks_view());
       }},
      {"naive like inputs",
       [](Attention& a) {
         return reference::forward(a.problem, a.q.view(), a.k.view(), a.v.view(), reference::Precision::kLikeInputs,
                                   a.sinks_view());
       }},
      {"forward_rows",
       [](Attention& a) {
         return rows_to_canonical(a.problem, reference::forward_rows(a.problem, a.q.view(), a.k.view(), a.v.view(),
                                                                     all_rows(a.problem), a.sinks_view()));
       }},
      {"tiled",
       [](Attention& a) {
         reference::tiled_forward(a.problem, a.args(), {16, 16, 0});
         return written_outputs(a);
       }},
      {"fa3::cpu::forward",
       [](Attention& a) {
         const Status st = cpu::forward(a.args());
         EXPECT_TRUE(st.is_ok()) << st.to_string();
         return written_outputs(a);
       }},
  };
}

}  // namespace fa3::testing
