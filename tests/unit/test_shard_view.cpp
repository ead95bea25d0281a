// The shard view alone (no MPI): over every rank of tp x pp x dp grids and ZeRO stages 0-3, the
// owned pieces tile each tensor once per rank at stage 0 and exactly once over the dp group from
// stage 1; the saved pieces of the whole grid cover every logical element of the model exactly
// once (tp replicas and the tied embedding's copy left out); every saved piece is owned.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "model/gpt.h"
#include "zero/shard_view.h"

using namespace zero3d;

namespace {

ModelConfig small() {
  ModelConfig m;
  m.vocab_size = 64, m.seq_len = 16, m.n_layer = 3, m.n_head = 4, m.d_model = 32;
  return m;
}

}  // namespace

TEST(ShardView, PiecesTileTheModel) {
  const ModelConfig m = small();
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      for (int dp : {1, 2, 3, 8})
        for (int stage = 0; stage <= 3; ++stage) {
          SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) +
                       " stage " + std::to_string(stage));
          std::map<int, std::vector<int>> saved;  // tensor id -> cover count per logical element
          for (const ParamInfo& p : gpt_param_table(m)) saved[p.id].assign(p.size, 0);
          for (int pr = 0; pr < pp; ++pr)
            for (int tr = 0; tr < tp; ++tr) {
              const FlatLayout L = make_flat_layout(gpt_param_table(m, tp, tr, pp, pr), dp, 700,
                                                    stage == 3 ? 100 : 0);
              std::vector<std::vector<int>> owned(L.tensors.size());
              for (size_t t = 0; t < L.tensors.size(); ++t) owned[t].assign(L.tensors[t].size, 0);
              for (int r = 0; r < dp; ++r) {
                const ShardView v(L, stage, r);
                for (const Piece& p : v.owned_pieces())
                  for (size_t k = p.begin; k < p.begin + p.size; ++k) ++owned[p.tensor][k];
                for (const Piece& p : v.saved_pieces()) {
                  (void)v.offset_in_owned(p);  // aborts when a saved piece is not owned
                  const ParamInfo& info = L.tensors[p.tensor];
                  for (size_t k = p.begin; k < p.begin + p.size; ++k) ++saved[info.id][logical_index(info, k)];
                }
              }
              for (const auto& t : owned)
                for (int n : t) ASSERT_EQ(n, stage == 0 ? dp : 1);
            }
          for (const auto& [id, cover] : saved)
            for (int n : cover) ASSERT_EQ(n, 1) << "tensor id " << id;
        }
}
