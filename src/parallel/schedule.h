// parallel/schedule.h: the pipeline schedule as a plain list of operations (pure logic, no MPI).
//
// Why: the trainer's step loop should not decide *when* to compute or exchange; it walks the
// list this module returns for its stage and does what each step says. Keeping the order here,
// as data, lets a unit test prove for every (stages, micro-batches) that the lists of all
// stages fit together -- every recv has its send, in the same order -- and that the pipeline
// bubble is the textbook one, without launching a single rank.
//
// Schedule: non-interleaved 1F1B (PipeDream-Flush), step for step Megatron-LM's
// forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py).
// With p stages, m micro-batches, on stage s:
//     warm-up   W = min(p - s - 1, m) forwards          recv_act(i)  F(i)  send_act(i)
//               then, if R = m - W > 0:                 recv_act(W)
//     steady    R pairs, j = 0..R-1:                    F(W+j)  send_act(W+j)  recv_grad(j)  B(j)
//                                                       send_grad(j)  [recv_act(W+j+1) unless j = R-1]
//     cool-down W backwards, i = 0..W-1:                recv_grad(R+i)  B(R+i)  send_grad(R+i)
// The first stage has no recv_act/send_grad (its input is the token batch), the last stage no
// send_act/recv_grad (its output goes into the loss). Backwards run in micro-batch order.
//
// The one non-obvious invariant -- the p2p ordering assumption. Megatron fuses the steady-state
// pairs into send_forward_recv_backward and send_backward_recv_forward, one batched
// isend+irecv each. We emit them as separate steps (send first, as Megatron lists them), which
// is deadlock-free only if a send never waits for its receiver: the runtime posts each step in
// list order, a send as MPI_Isend (request completed later: before its buffer is reused or at
// the end of the step), a recv as MPI_Irecv that is waited on before the next compute step.
// With blocking rendezvous sends the lists DO deadlock (p = 2: stage 0 blocks in send_act(1)
// while stage 1 blocks in send_grad(0)). Messages on one link and direction are matched in
// order (MPI's non-overtaking rule), so any tag works; the micro-batch index is a good one.
//
// Memory bound: forwards done minus backwards done never exceeds p - s on stage s (at most
// W + 1 micro-batches of activations are alive), independent of m -- GPipe would keep m.
//
// Worked example, p = 4 stages, m = 8 micro-batches (F/B = forward/backward, rA/sA = recv/send
// activation, rG/sG = recv/send gradient, number = micro-batch; "|" only groups for reading):
//   stage 0 (W=3, R=5): F0 sA0 | F1 sA1 | F2 sA2 |
//                       F3 sA3 rG0 B0 | F4 sA4 rG1 B1 | F5 sA5 rG2 B2 | F6 sA6 rG3 B3 | F7 sA7 rG4 B4 |
//                       rG5 B5 | rG6 B6 | rG7 B7
//   stage 1 (W=2, R=6): rA0 F0 sA0 | rA1 F1 sA1 | rA2 |
//                       F2 sA2 rG0 B0 sG0 rA3 | F3 sA3 rG1 B1 sG1 rA4 | ... | F7 sA7 rG5 B5 sG5 |
//                       rG6 B6 sG6 | rG7 B7 sG7
//   stage 3 (W=0, R=8): rA0 | F0 B0 sG0 rA1 | F1 B1 sG1 rA2 | ... | F6 B6 sG6 rA7 | F7 B7 sG7
// With t_bwd = 2 t_fwd every stage is idle (p-1)(t_fwd+t_bwd) of the (m+p-1)(t_fwd+t_bwd)
// step: bubble fraction 3/11 here; simulate_idle_fraction(4, 8, 1, 2) returns exactly that.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

namespace zero3d {

enum class PipeOp {
  forward,          // run the stage's layers on micro-batch m (input: tokens on stage 0)
  backward,         // backprop micro-batch m (output grad: the loss on the last stage)
  send_activation,  // send forward's output of m to stage s+1
  recv_activation,  // receive the input of m from stage s-1 (before forward(m))
  send_grad,        // send the gradient w.r.t. the input of m to stage s-1 (after backward(m))
  recv_grad,        // receive the gradient w.r.t. the output of m from stage s+1 (before backward(m))
};

inline constexpr int kNoPeer = -1;  // peer_stage of forward/backward

struct PipeStep {
  PipeOp op;
  int micro_batch;
  int peer_stage;  // the stage on the other end of a send/recv; kNoPeer for compute
  bool operator==(const PipeStep&) const = default;
};

// The ops of `stage` (0-based) in a pipeline of num_stages, num_micro_batches per step, in the
// order the runtime must post them. Throws std::invalid_argument unless num_stages >= 1,
// 0 <= stage < num_stages, num_micro_batches >= 1.
std::vector<PipeStep> one_f_one_b(int stage, int num_stages, int num_micro_batches);
// How many micro-batches `stage` holds in flight under one_f_one_b: one set of activations each.
inline int one_f_one_b_in_flight(int stage, int num_stages, int num_micro_batches) {
  return num_stages == 1 ? 1 : std::min(num_stages - stage, num_micro_batches);
}

// Number of warm-up forwards of `stage`: min(num_stages - stage - 1, num_micro_batches).
int num_warmup_micro_batches(int stage, int num_stages, int num_micro_batches);

// The pipeline bubble of 1F1B (and GPipe): (p - 1) / (m + p - 1) of each stage's step time.
double ideal_bubble_fraction(int num_stages, int num_micro_batches);

struct PipeSimResult {
  double makespan = 0;       // time at which the last stage finishes its last op
  double idle_fraction = 0;  // sum over stages of (makespan - busy) / (stages * makespan)
  std::vector<int> max_in_flight;  // per stage: peak of (forwards done - backwards done)
};

// Runs every stage's list against the others, discrete-event fashion: forward costs t_fwd,
// backward t_bwd, communication is free, a send never waits, a recv waits until its peer has
// executed the matching send. Messages on each (from, to, kind) link are matched in FIFO order.
// Throws std::logic_error on deadlock (no stage can proceed but some have ops left), on a recv
// whose oldest pending message is for another micro-batch, on a send/recv to a stage that does
// not exist or is not a neighbour in the right direction, and on messages left unreceived.
PipeSimResult simulate_pipeline(const std::vector<std::vector<PipeStep>>& stage_ops, double t_fwd,
                                double t_bwd);

// simulate_pipeline on one_f_one_b of every stage; returns the idle fraction.
double simulate_idle_fraction(int num_stages, int num_micro_batches, double t_fwd, double t_bwd);

const char* to_string(PipeOp op);
std::string to_string(const PipeStep& step);  // e.g. "recv_grad(3 from 2)", "forward(0)"

}  // namespace zero3d
