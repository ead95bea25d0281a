// Pipeline schedule: the 1F1B op lists of all stages, checked one by one (every micro-batch
// once, dependencies in order, 1F1B's memory bound), against each other (sends match recvs in
// order), against hand-written lists, and run together in the simulator (no deadlock, bubble
// = (p-1)/(m+p-1)). Pure logic: no MPI needed.
#include <gtest/gtest.h>

#include <ostream>
#include <stdexcept>

#include "parallel/schedule.h"

namespace zero3d {
// Readable gtest failure messages for PipeStep / lists of them.
void PrintTo(const PipeStep& s, std::ostream* os) { *os << to_string(s); }
}  // namespace zero3d

using namespace zero3d;
using Ops = std::vector<PipeStep>;

namespace {

PipeStep F(int m) { return {PipeOp::forward, m, kNoPeer}; }
PipeStep B(int m) { return {PipeOp::backward, m, kNoPeer}; }
PipeStep sA(int m, int peer) { return {PipeOp::send_activation, m, peer}; }
PipeStep rA(int m, int peer) { return {PipeOp::recv_activation, m, peer}; }
PipeStep sG(int m, int peer) { return {PipeOp::send_grad, m, peer}; }
PipeStep rG(int m, int peer) { return {PipeOp::recv_grad, m, peer}; }

std::vector<Ops> all_stages(int p, int m) {
  std::vector<Ops> v;
  for (int s = 0; s < p; ++s) v.push_back(one_f_one_b(s, p, m));
  return v;
}

// Index in `ops` of the unique step (op, mb); -1 if absent; -2 if it occurs more than once.
int find_once(const Ops& ops, PipeOp op, int mb) {
  int at = -1;
  for (int i = 0; i < int(ops.size()); ++i)
    if (ops[i].op == op && ops[i].micro_batch == mb) at = (at == -1) ? i : -2;
  return at;
}

int count_op(const Ops& ops, PipeOp op) {
  int n = 0;
  for (const auto& s : ops) n += s.op == op;
  return n;
}

// Micro-batches of the steps with `op` to `peer`, in list order.
std::vector<int> sequence(const Ops& ops, PipeOp op, int peer) {
  std::vector<int> v;
  for (const auto& s : ops)
    if (s.op == op) {
      EXPECT_EQ(s.peer_stage, peer) << to_string(s);
      v.push_back(s.micro_batch);
    }
  return v;
}

struct Shape {
  int p, m;
};
// p = 1; m < p; m = p; m > p; m = 1; odd sizes.
const Shape kShapes[] = {{1, 1}, {1, 5}, {2, 1}, {2, 2}, {2, 3}, {3, 7}, {4, 2}, {4, 4},
                         {4, 8}, {5, 1}, {5, 3}, {8, 3}, {8, 8}, {8, 32}, {16, 5}};

}  // namespace

TEST(Schedule, WarmupCountIsMegatrons) {
  EXPECT_EQ(num_warmup_micro_batches(0, 4, 8), 3);
  EXPECT_EQ(num_warmup_micro_batches(2, 4, 8), 1);
  EXPECT_EQ(num_warmup_micro_batches(3, 4, 8), 0);
  EXPECT_EQ(num_warmup_micro_batches(0, 4, 2), 2);  // m < p: everything is warm-up + cool-down
  EXPECT_EQ(num_warmup_micro_batches(0, 1, 5), 0);
}

TEST(Schedule, EveryStageComputesEveryMicroBatchOnceInDependencyOrder) {
  for (auto [p, m] : kShapes) {
    for (int s = 0; s < p; ++s) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + " stage " + std::to_string(s));
      const Ops ops = one_f_one_b(s, p, m);
      const bool first = s == 0, last = s == p - 1;
      EXPECT_EQ(count_op(ops, PipeOp::forward), m);
      EXPECT_EQ(count_op(ops, PipeOp::backward), m);
      EXPECT_EQ(count_op(ops, PipeOp::recv_activation), first ? 0 : m);
      EXPECT_EQ(count_op(ops, PipeOp::send_grad), first ? 0 : m);
      EXPECT_EQ(count_op(ops, PipeOp::send_activation), last ? 0 : m);
      EXPECT_EQ(count_op(ops, PipeOp::recv_grad), last ? 0 : m);
      EXPECT_EQ(int(ops.size()), 2 * m + (first ? 0 : 2 * m) + (last ? 0 : 2 * m));
      for (int mb = 0; mb < m; ++mb) {
        const int f = find_once(ops, PipeOp::forward, mb), b = find_once(ops, PipeOp::backward, mb);
        ASSERT_GE(f, 0) << "forward " << mb;
        ASSERT_GE(b, 0) << "backward " << mb;
        EXPECT_LT(f, b) << "micro-batch " << mb;
        if (!first) {
          const int ra = find_once(ops, PipeOp::recv_activation, mb);
          const int sg = find_once(ops, PipeOp::send_grad, mb);
          ASSERT_GE(ra, 0);
          ASSERT_GE(sg, 0);
          EXPECT_LT(ra, f) << "recv_activation before forward, micro-batch " << mb;
          EXPECT_GT(sg, b) << "send_grad after backward, micro-batch " << mb;
        }
        if (!last) {
          const int sa = find_once(ops, PipeOp::send_activation, mb);
          const int rg = find_once(ops, PipeOp::recv_grad, mb);
          ASSERT_GE(sa, 0);
          ASSERT_GE(rg, 0);
          EXPECT_GT(sa, f) << "send_activation after forward, micro-batch " << mb;
          EXPECT_LT(rg, b) << "recv_grad before backward, micro-batch " << mb;
        }
      }
    }
  }
}

TEST(Schedule, SendsMatchRecvsOnThePeerInCountAndOrder) {
  for (auto [p, m] : kShapes) {
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
    const auto st = all_stages(p, m);
    for (int s = 0; s + 1 < p; ++s) {
      // activations s -> s+1, gradients s+1 -> s; peers named correctly on both ends
      const auto sent_act = sequence(st[s], PipeOp::send_activation, s + 1);
      EXPECT_EQ(sent_act, sequence(st[s + 1], PipeOp::recv_activation, s)) << "link " << s;
      const auto sent_grad = sequence(st[s + 1], PipeOp::send_grad, s);
      EXPECT_EQ(sent_grad, sequence(st[s], PipeOp::recv_grad, s + 1)) << "link " << s;
      EXPECT_EQ(int(sent_act.size()), m);
      EXPECT_EQ(int(sent_grad.size()), m);
    }
  }
}

TEST(Schedule, InFlightMicroBatchesNeverExceedStagesRemaining) {
  for (auto [p, m] : kShapes) {
    for (int s = 0; s < p; ++s) {
      int in_flight = 0, peak = 0;
      for (const auto& step : one_f_one_b(s, p, m)) {
        in_flight += step.op == PipeOp::forward ? 1 : step.op == PipeOp::backward ? -1 : 0;
        peak = std::max(peak, in_flight);
        ASSERT_LE(in_flight, p - s) << "p=" << p << " m=" << m << " stage " << s;
      }
      EXPECT_EQ(in_flight, 0);
      EXPECT_EQ(peak, std::min(p - s, m)) << "p=" << p << " m=" << m << " stage " << s;  // tight
    }
  }
}

TEST(Schedule, TwoStagesThreeMicroBatchesByHand) {
  // stage 0: W = 1, R = 2; stage 1: W = 0, R = 3
  EXPECT_EQ(one_f_one_b(0, 2, 3), (Ops{F(0), sA(0, 1),                        //
                                       F(1), sA(1, 1), rG(0, 1), B(0),         //
                                       F(2), sA(2, 1), rG(1, 1), B(1),         //
                                       rG(2, 1), B(2)}));
  EXPECT_EQ(one_f_one_b(1, 2, 3), (Ops{rA(0, 0),                               //
                                       F(0), B(0), sG(0, 0), rA(1, 0),         //
                                       F(1), B(1), sG(1, 0), rA(2, 0),         //
                                       F(2), B(2), sG(2, 0)}));
}

TEST(Schedule, FourStagesEightMicroBatchesByHand) {
  // The worked example of the header.
  EXPECT_EQ(one_f_one_b(0, 4, 8),
            (Ops{F(0), sA(0, 1), F(1), sA(1, 1), F(2), sA(2, 1),                    // warm-up 3
                 F(3), sA(3, 1), rG(0, 1), B(0), F(4), sA(4, 1), rG(1, 1), B(1),    // steady 5
                 F(5), sA(5, 1), rG(2, 1), B(2), F(6), sA(6, 1), rG(3, 1), B(3),    //
                 F(7), sA(7, 1), rG(4, 1), B(4),                                    //
                 rG(5, 1), B(5), rG(6, 1), B(6), rG(7, 1), B(7)}));                 // cool-down 3
  EXPECT_EQ(one_f_one_b(1, 4, 8),
            (Ops{rA(0, 0), F(0), sA(0, 2), rA(1, 0), F(1), sA(1, 2), rA(2, 0),                     //
                 F(2), sA(2, 2), rG(0, 2), B(0), sG(0, 0), rA(3, 0),                               //
                 F(3), sA(3, 2), rG(1, 2), B(1), sG(1, 0), rA(4, 0),                               //
                 F(4), sA(4, 2), rG(2, 2), B(2), sG(2, 0), rA(5, 0),                               //
                 F(5), sA(5, 2), rG(3, 2), B(3), sG(3, 0), rA(6, 0),                               //
                 F(6), sA(6, 2), rG(4, 2), B(4), sG(4, 0), rA(7, 0),                               //
                 F(7), sA(7, 2), rG(5, 2), B(5), sG(5, 0),                                         //
                 rG(6, 2), B(6), sG(6, 0), rG(7, 2), B(7), sG(7, 0)}));
  Ops last{rA(0, 2)};
  for (int mb = 0; mb < 8; ++mb) {
    for (auto st : {F(mb), B(mb), sG(mb, 2)}) last.push_back(st);
    if (mb < 7) last.push_back(rA(mb + 1, 2));
  }
  EXPECT_EQ(one_f_one_b(3, 4, 8), last);
}

TEST(Schedule, MoreStagesThanMicroBatchesIsAllWarmupAndCooldown) {
  // p = 4, m = 2, stage 0: W = 2, R = 0 -- no steady state and no extra recv before it.
  EXPECT_EQ(one_f_one_b(0, 4, 2), (Ops{F(0), sA(0, 1), F(1), sA(1, 1), rG(0, 1), B(0), rG(1, 1), B(1)}));
  // Single stage: plain F B F B ..., no communication.
  EXPECT_EQ(one_f_one_b(0, 1, 3), (Ops{F(0), B(0), F(1), B(1), F(2), B(2)}));
}

TEST(Schedule, SimulatedBubbleIsTheIdealOne) {
  for (auto [p, m] : kShapes) {
    const double ideal = ideal_bubble_fraction(p, m);
    EXPECT_DOUBLE_EQ(ideal, double(p - 1) / (m + p - 1));
    EXPECT_NEAR(simulate_idle_fraction(p, m, 1.0, 2.0), ideal, 1e-9) << "p=" << p << " m=" << m;
    EXPECT_NEAR(simulate_idle_fraction(p, m, 0.25, 0.5), ideal, 1e-9) << "p=" << p << " m=" << m;
    // 1F1B's bubble does not depend on the forward/backward ratio either.
    EXPECT_NEAR(simulate_idle_fraction(p, m, 1.0, 1.0), ideal, 1e-9) << "p=" << p << " m=" << m;
    EXPECT_NEAR(simulate_idle_fraction(p, m, 1.0, 3.0), ideal, 1e-9) << "p=" << p << " m=" << m;
  }
  EXPECT_NEAR(simulate_idle_fraction(4, 8, 1.0, 2.0), 3.0 / 11.0, 1e-12);  // header example
  EXPECT_DOUBLE_EQ(simulate_idle_fraction(1, 4, 1.0, 2.0), 0.0);
}

TEST(Schedule, SimulatorMakespanAndMemory) {
  const auto r = simulate_pipeline(all_stages(4, 8), 1.0, 2.0);
  EXPECT_DOUBLE_EQ(r.makespan, (8 + 4 - 1) * 3.0);
  EXPECT_EQ(r.max_in_flight, (std::vector<int>{4, 3, 2, 1}));

  // GPipe (all forwards, then all backwards in reverse) fits together too and has the same
  // bubble, but keeps all m micro-batches alive on every stage: what 1F1B exists to avoid.
  const int p = 4, m = 8;
  std::vector<Ops> gpipe(p);
  for (int s = 0; s < p; ++s) {
    for (int mb = 0; mb < m; ++mb) {
      if (s > 0) gpipe[s].push_back(rA(mb, s - 1));
      gpipe[s].push_back(F(mb));
      if (s < p - 1) gpipe[s].push_back(sA(mb, s + 1));
    }
    for (int mb = m - 1; mb >= 0; --mb) {
      if (s < p - 1) gpipe[s].push_back(rG(mb, s + 1));
      gpipe[s].push_back(B(mb));
      if (s > 0) gpipe[s].push_back(sG(mb, s - 1));
    }
  }
  const auto g = simulate_pipeline(gpipe, 1.0, 2.0);
  EXPECT_NEAR(g.idle_fraction, ideal_bubble_fraction(p, m), 1e-9);
  EXPECT_EQ(g.max_in_flight, (std::vector<int>(p, m)));
}

TEST(Schedule, SimulatorDetectsInconsistentLists) {
  // Deadlock: stage 0 waits for a gradient before sending the activation it depends on.
  EXPECT_THROW(simulate_pipeline({{rG(0, 1), F(0), sA(0, 1), B(0)}, {rA(0, 0), F(0), B(0), sG(0, 0)}}, 1, 2),
               std::logic_error);
  // Both stages wait for each other's gradient/activation.
  EXPECT_THROW(simulate_pipeline({{F(0), rG(0, 1), sA(0, 1), B(0)}, {rA(0, 0), F(0), B(0), sG(0, 0)}}, 1, 2),
               std::logic_error);
  // Order mismatch on a link: activations sent 1, 0 but received 0, 1.
  EXPECT_THROW(simulate_pipeline({{F(1), sA(1, 1), F(0), sA(0, 1)}, {rA(0, 0), F(0), rA(1, 0), F(1)}}, 1, 2),
               std::logic_error);
  // A message nobody receives.
  EXPECT_THROW(simulate_pipeline({{F(0), sA(0, 1)}, {}}, 1, 2), std::logic_error);
  // A peer that is not the neighbour in the op's direction.
  EXPECT_THROW(simulate_pipeline({{F(0), sA(0, 2)}, {}, {rA(0, 0), F(0)}}, 1, 2), std::logic_error);
  // The real lists never deadlock.
  for (auto [p, m] : kShapes) EXPECT_NO_THROW(simulate_pipeline(all_stages(p, m), 1, 2)) << p << " " << m;
}

TEST(Schedule, RejectsBadShapes) {
  EXPECT_THROW(one_f_one_b(0, 0, 4), std::invalid_argument);
  EXPECT_THROW(one_f_one_b(4, 4, 4), std::invalid_argument);
  EXPECT_THROW(one_f_one_b(-1, 4, 4), std::invalid_argument);
  EXPECT_THROW(one_f_one_b(0, 4, 0), std::invalid_argument);
  EXPECT_THROW(ideal_bubble_fraction(4, 0), std::invalid_argument);
}

TEST(Schedule, StepNames) {
  EXPECT_EQ(to_string(F(3)), "forward(3)");
  EXPECT_EQ(to_string(rG(3, 2)), "recv_grad(3 from 2)");
  EXPECT_EQ(to_string(sA(0, 1)), "send_activation(0 to 1)");
}
