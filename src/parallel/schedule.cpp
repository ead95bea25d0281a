#include "parallel/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>
#include <tuple>

namespace zero3d {

namespace {

void check_shape(int stage, int num_stages, int num_micro_batches) {
  if (num_stages < 1 || stage < 0 || stage >= num_stages || num_micro_batches < 1)
    throw std::invalid_argument("pipeline schedule needs num_stages >= 1, 0 <= stage < num_stages, "
                                "num_micro_batches >= 1; got stage " + std::to_string(stage) +
                                " of " + std::to_string(num_stages) + ", " +
                                std::to_string(num_micro_batches) + " micro-batches");
}

bool is_compute(PipeOp op) { return op == PipeOp::forward || op == PipeOp::backward; }
bool is_send(PipeOp op) { return op == PipeOp::send_activation || op == PipeOp::send_grad; }

// The stage a send/recv must name as its peer: activations flow s -> s+1, gradients s+1 -> s.
int expected_peer(PipeOp op, int stage) {
  switch (op) {
    case PipeOp::send_activation:
    case PipeOp::recv_grad: return stage + 1;
    case PipeOp::recv_activation:
    case PipeOp::send_grad: return stage - 1;
    default: return kNoPeer;
  }
}

}  // namespace

int num_warmup_micro_batches(int stage, int num_stages, int num_micro_batches) {
  check_shape(stage, num_stages, num_micro_batches);
  return std::min(num_stages - stage - 1, num_micro_batches);
}

std::vector<PipeStep> one_f_one_b(int stage, int num_stages, int num_micro_batches) {
  const int warmup = num_warmup_micro_batches(stage, num_stages, num_micro_batches);
  const int remaining = num_micro_batches - warmup;
  const bool first = stage == 0, last = stage == num_stages - 1;
  const int prev = stage - 1, next = stage + 1;

  std::vector<PipeStep> ops;
  ops.reserve(6 * num_micro_batches);
  auto recv_act = [&](int mb) { if (!first) ops.push_back({PipeOp::recv_activation, mb, prev}); };
  auto send_act = [&](int mb) { if (!last) ops.push_back({PipeOp::send_activation, mb, next}); };
  auto recv_grad = [&](int mb) { if (!last) ops.push_back({PipeOp::recv_grad, mb, next}); };
  auto send_grad = [&](int mb) { if (!first) ops.push_back({PipeOp::send_grad, mb, prev}); };
  auto forward = [&](int mb) { ops.push_back({PipeOp::forward, mb, kNoPeer}); };
  auto backward = [&](int mb) { ops.push_back({PipeOp::backward, mb, kNoPeer}); };

  // Warm-up: fill the pipeline below this stage.
  for (int i = 0; i < warmup; ++i) {
    recv_act(i);
    forward(i);
    send_act(i);
  }
  // Megatron receives the first steady-state input before the loop.
  if (remaining > 0) recv_act(warmup);
  // Steady state: one forward (micro-batch warmup + j), one backward (micro-batch j).
  // Megatron: send_forward_recv_backward, backward, send_backward_recv_forward (or, on the
  // last iteration, send_backward alone).
  for (int j = 0; j < remaining; ++j) {
    forward(warmup + j);
    send_act(warmup + j);
    recv_grad(j);
    backward(j);
    send_grad(j);
    if (j + 1 < remaining) recv_act(warmup + j + 1);
  }
  // Cool-down: drain the backwards of the warm-up micro-batches.
  for (int i = 0; i < warmup; ++i) {
    recv_grad(remaining + i);
    backward(remaining + i);
    send_grad(remaining + i);
  }
  return ops;
}

double ideal_bubble_fraction(int num_stages, int num_micro_batches) {
  check_shape(0, num_stages, num_micro_batches);
  return double(num_stages - 1) / double(num_micro_batches + num_stages - 1);
}

PipeSimResult simulate_pipeline(const std::vector<std::vector<PipeStep>>& stage_ops, double t_fwd,
                                double t_bwd) {
  const int p = int(stage_ops.size());
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0), busy(p, 0.0);
  std::vector<int> in_flight(p, 0);
  PipeSimResult r;
  r.max_in_flight.assign(p, 0);
  // (from, to, is_grad) -> messages sent and not yet received: (micro-batch, time sent).
  std::map<std::tuple<int, int, bool>, std::deque<std::pair<int, double>>> links;

  auto fail = [](int s, const PipeStep& st, const std::string& why) {
    throw std::logic_error("pipeline simulation: stage " + std::to_string(s) + " " +
                           to_string(st) + ": " + why);
  };

  // Run each stage as far as it can go; repeat until nobody moves. Communication is free, so
  // an op's time depends only on its own stage's clock and (for a recv) the send's time: any
  // order of visiting the stages gives the same times.
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto& ops = stage_ops[s];
      for (; pc[s] < ops.size(); ++pc[s], progress = true) {
        const PipeStep& st = ops[pc[s]];
        if (is_compute(st.op)) {
          const double t = st.op == PipeOp::forward ? t_fwd : t_bwd;
          clock[s] += t;
          busy[s] += t;
          in_flight[s] += st.op == PipeOp::forward ? 1 : -1;
          r.max_in_flight[s] = std::max(r.max_in_flight[s], in_flight[s]);
          continue;
        }
        if (st.peer_stage != expected_peer(st.op, s) || st.peer_stage < 0 || st.peer_stage >= p)
          fail(s, st, "peer must be stage " + std::to_string(expected_peer(st.op, s)) + " of " +
                          std::to_string(p));
        const bool grad = st.op == PipeOp::send_grad || st.op == PipeOp::recv_grad;
        if (is_send(st.op)) {
          links[{s, st.peer_stage, grad}].emplace_back(st.micro_batch, clock[s]);
          continue;
        }
        auto& q = links[{st.peer_stage, s, grad}];
        if (q.empty()) break;  // wait for the peer
        if (q.front().first != st.micro_batch)
          fail(s, st, "the oldest message on this link is for micro-batch " +
                          std::to_string(q.front().first));
        clock[s] = std::max(clock[s], q.front().second);
        q.pop_front();
      }
    }
  }

  std::string stuck;
  for (int s = 0; s < p; ++s)
    if (pc[s] < stage_ops[s].size())
      stuck += " stage " + std::to_string(s) + " waits in " + to_string(stage_ops[s][pc[s]]) + ";";
  if (!stuck.empty()) throw std::logic_error("pipeline simulation: deadlock:" + stuck);
  for (const auto& [key, q] : links)
    if (!q.empty())
      throw std::logic_error("pipeline simulation: stage " + std::to_string(std::get<0>(key)) +
                             " sent " + std::to_string(q.size()) + " message(s) to stage " +
                             std::to_string(std::get<1>(key)) + " that were never received");

  for (int s = 0; s < p; ++s) r.makespan = std::max(r.makespan, clock[s]);
  if (r.makespan > 0) {
    double idle = 0;
    for (int s = 0; s < p; ++s) idle += r.makespan - busy[s];
    r.idle_fraction = idle / (p * r.makespan);
  }
  return r;
}

double simulate_idle_fraction(int num_stages, int num_micro_batches, double t_fwd, double t_bwd) {
  check_shape(0, num_stages, num_micro_batches);
  std::vector<std::vector<PipeStep>> ops;
  for (int s = 0; s < num_stages; ++s) ops.push_back(one_f_one_b(s, num_stages, num_micro_batches));
  return simulate_pipeline(ops, t_fwd, t_bwd).idle_fraction;
}

const char* to_string(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "forward";
    case PipeOp::backward: return "backward";
    case PipeOp::send_activation: return "send_activation";
    case PipeOp::recv_activation: return "recv_activation";
    case PipeOp::send_grad: return "send_grad";
    case PipeOp::recv_grad: return "recv_grad";
  }
  return "?";
}

std::string to_string(const PipeStep& step) {
  std::string s = std::string(to_string(step.op)) + "(" + std::to_string(step.micro_batch);
  if (step.peer_stage != kNoPeer)
    s += (is_send(step.op) ? " to " : " from ") + std::to_string(step.peer_stage);
  return s + ")";
}

}  // namespace zero3d
