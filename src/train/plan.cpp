#include "train/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "kernels/math/adamw.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/groups.h"
#include "parallel/schedule.h"
#include "parallel/topology.h"
#include "storage/swap_file.h"
#include "train/commands.h"
#include "train/machine.h"
#include "zero/engine.h"

namespace zero3d {

namespace {

// A group of the planned layout's shape that never communicates: building an engine only asks a
// group its size and rank; a step's collectives complete at once, moving nothing, and are counted
// by ProcessGroup's comms log like a run's (comm_log(), while active).
class SizingGroup final : public ProcessGroup {
 public:
  SizingGroup(int size, int rank, std::string name) : ProcessGroup(size, rank, std::move(name)) {}
  void use_device_memory(DeviceMemory*, bool) override {}
  std::string device_path() const override { return "none (sizing)"; }
  std::string collectives_path() const override { return "none (sizing)"; }

 protected:
  PendingOp all_reduce_impl(MemRef<void>, size_t, CommType, RedOp) override { return {}; }
  PendingOp reduce_scatter_impl(MemRef<const void>, MemRef<void>, const MessageSlices&, CommType) override { return {}; }
  PendingOp all_gather_impl(MemRef<const void>, MemRef<void>, const MessageSlices&, CommType) override { return {}; }
  PendingOp broadcast_impl(MemRef<void>, size_t, int) override { return {}; }
  PendingOp send_impl(MemRef<const void>, size_t, int, int) override { return {}; }
  PendingOp recv_impl(MemRef<void>, size_t, int, int) override { return {}; }
};

// Offload to nvme without a disk: the engine's swap files as sizing ones (no file; their transfers
// counted), at the paths a run would make. `params_out`: the parameters' file for offload_param cpu
// too, to count what a gather brings in from host memory.
SwapFiles sizing_swap(const Config& c, bool params_out = false) {
  SwapFiles s;
  s.aio = c.aio, s.sizing = true;
  auto path = [](const OffloadConfig& off, const char* what) {
    return strprintf("%s/plan.%s", swap_dir(off.nvme_path.empty() ? "." : off.nvme_path, "zero3d plan").c_str(), what);
  };
  if (c.zero.offload_optimizer.device == OffloadDevice::nvme) s.optimizer = path(c.zero.offload_optimizer, "optimizer");
  const OffloadDevice par = c.zero.offload_param.device;
  if (c.zero.stage == 3 && (par == OffloadDevice::nvme || (params_out && par == OffloadDevice::cpu)))
    s.param = path(c.zero.offload_param, "param");
  return s;
}

}  // namespace

RankMemory size_rank(const Config& c, int dp, int pp_rank, MemKind kind) {
  auto tally = std::make_shared<MemoryTally>();
  std::unique_ptr<Backend> be = make_sizing_backend(kind, tally);
  SizingGroup dp_group(dp, 0, "dp"), tp_group(c.tp_size, 0, "tp");
  RankMemory r;
  r.pp_rank = pp_rank;
  {
    ZeroEngine engine(*be, dp_group, c.model, c.zero, c.optimizer, c.precision, c.tp_size, 0, c.pp_size, pp_rank,
                      sizing_swap(c));
    const PipelineStage stage = pipeline_stage(c.model, c.pp_size, pp_rank);
    std::vector<std::unique_ptr<GPT>> models;  // as StepRunner holds them
    for (int k = 0; k < one_f_one_b_in_flight(pp_rank, c.pp_size, c.gradient_accumulation_steps); ++k)
      models.push_back(std::make_unique<GPT>(*be, c.model, c.train_micro_batch_size_per_gpu, engine,
                                             GPTOptions{c.activation_checkpointing}, &tp_group, stage));
    const MemoryAccount m = engine.memory();
    r.params = m.params, r.grads = m.grads, r.optimizer = m.optimizer, r.buffers = m.buffers;
    for (const auto& g : models) r.activations += g->activation_bytes();
    const uint64_t counted = r.params + r.grads + r.optimizer + r.buffers + r.activations;
    r.other = tally->peak > counted ? tally->peak - counted : 0;
    r.host = m.host, r.swapped = m.swapped;
  }
  return r;
}

namespace {

// How an op of the counted work is priced: by its FLOPs (GEMM, attention) or by its bytes.
enum class OpKind { gemm, attention, bytes };
OpKind op_kind(const std::string& op) {
  if (op.starts_with("gemm") || op == "linear_forward") return OpKind::gemm;
  return op.starts_with("attention") ? OpKind::attention : OpKind::bytes;
}

}  // namespace

StepWork count_step(const Config& c, int dp, int pp_rank) {
  std::unique_ptr<Backend> be = make_sizing_backend(MemKind::host, std::make_shared<MemoryTally>());
  SizingGroup dp_group(dp, 0, "dp"), tp_group(c.tp_size, 0, "tp");
  ZeroEngine engine(*be, dp_group, c.model, c.zero, c.optimizer, c.precision, c.tp_size, 0, c.pp_size, pp_rank,
                    sizing_swap(c, true));
  GPT model(*be, c.model, c.train_micro_batch_size_per_gpu, engine, GPTOptions{c.activation_checkpointing}, &tp_group,
            pipeline_stage(c.model, c.pp_size, pp_rank));
  std::vector<int32_t> tokens(static_cast<size_t>(c.train_micro_batch_size_per_gpu) * c.model.seq_len);
  CommLog& log = comm_log();
  const CommLog saved = log;
  log.enabled = log.active = true, log.verbose = false, log.ops.clear();
  StepWork w;
  auto take = [&](StepWork::Part& part) {
    part.ops = be->profile()->ops;
    for (const auto& [key, st] : log.stats) part.comms[key.first + " " + key.second] = st;
    const SwapIo io = engine.take_swap_io();
    part.swap_read = io.bytes_read, part.swap_written = io.bytes_written;
    part.param_read = io.param_bytes_read, part.param_written = io.param_bytes_written;
    log.stats.clear();
    be->profile()->ops.clear();
  };
  const int micro_batches = std::min(2, c.gradient_accumulation_steps);
  for (int step = 0; step < 2; ++step) {  // the second step's, as every step after the first runs (ZeRO-3's
    log.stats.clear();                    // pool prefetches along the first one's trace)
    be->profile()->ops.clear();
    engine.take_swap_io();
    engine.begin_step(micro_batches);
    for (int k = 0; k < micro_batches; ++k) {
      model.forward(tokens.data(), tokens.data(), 1.0f / static_cast<float>(tokens.size()));
      model.backward();
      take(k == 0 ? w.micro_batch : w.later_micro_batch);
    }
    engine.finish_gradients();
    engine.optimizer_step(c.optimizer.lr);
    engine.gather_updated_params();
    take(w.step_end);
  }
  w.read_ahead = engine.swap_read_ahead_bytes();
  log = saved;
  return w;
}

bool prices(const MachineRates& m, const Config& c) {
  const OffloadDevice opt = c.zero.offload_optimizer.device, par = c.zero.offload_param.device;
  if ((opt == OffloadDevice::nvme || par == OffloadDevice::nvme) && !(m.nvme_read_bytes > 0 && m.nvme_write_bytes > 0))
    return false;
  return !m.device || opt == OffloadDevice::none || (m.pcie_bytes > 0 && m.host_adam_bytes > 0);
}

StepTime price_step(const Config& c, int dp, const MachineRates& m) {
  Z3D_ASSERT(prices(m, c), "price_step: a layout the machine's rates do not price");
  const double act_bytes = 4.0 * c.train_micro_batch_size_per_gpu * c.model.seq_len * c.model.d_model;
  // The groups on the machine's nodes (parallel/topology.h): a group across nodes is priced on the
  // network, its share of it the fewest of its ranks one node holds (one link a rank).
  const int R = std::max(1, m.ranks_per_node), tp = c.tp_size;
  const Topology topo = Topology::make(tp * dp * c.pp_size, tp, c.pp_size);
  const bool network = !m.inter_node.collectives.empty();
  const int tp_span = network ? topo.fewest_on_a_node(&Topology::tp_group, R) : 0,
            dp_span = network ? topo.fewest_on_a_node(&Topology::dp_group, R) : 0;
  const double gemm = c.precision == Precision::bf16 && m.gemm_bf16_flops > 0 ? m.gemm_bf16_flops : m.gemm_flops;
  const OffloadDevice opt = c.zero.offload_optimizer.device, par = c.zero.offload_param.device;
  const bool link = m.device && opt != OffloadDevice::none;  // the update on the CPU, across the host link
  const bool opt_swapped = opt == OffloadDevice::nvme, par_swapped = c.zero.stage == 3 && par == OffloadDevice::nvme;
  // Stage 3's slices come in from outside the memory that computes (on a CPU, cpu is that memory).
  const bool params_in = par_swapped || (c.zero.stage == 3 && m.device && par == OffloadDevice::cpu);
  auto disk = [&](uint64_t read, uint64_t written) {  // seconds of swap-file traffic
    return static_cast<double>(read) / m.nvme_read_bytes + static_cast<double>(written) / m.nvme_write_bytes;
  };
  struct Comm {
    double dp = 0, tp = 0;
  };
  auto comm_seconds = [&](const StepWork::Part& part) {
    Comm t;
    for (const auto& [what, st] : part.comms) {
      const std::string group = what.substr(0, what.find(' ')), op = what.substr(what.find(' ') + 1);
      if (!st.calls || (group != "dp" && group != "tp")) continue;
      const bool is_dp = group == "dp";
      const int size = is_dp ? dp : tp, span = is_dp ? dp_span : tp_span;
      (is_dp ? t.dp : t.tp) +=
          st.calls * m.collective_seconds(op, static_cast<double>(st.msg_bytes) / st.calls, size, span ? span : size);
    }
    return t;
  };
  // ZeRO-0/1 reduce the gradients once a step: with overlap_comm during the last micro-batch's
  // backward, else at the step's end (count_step's last micro-batch holds the reduction either way).
  const bool reduce_once = c.zero.stage < 2;
  // A micro-batch's seconds on one stage: compute, tp's collectives, dp's (exposed), and the wait for
  // offloaded slices (read or copied in ahead of their gathers by the pool's prefetch: what exceeds
  // the micro-batch's compute).
  struct Slot {
    double compute = 0, tp = 0, dp = 0, fill = 0;
  };
  auto slot = [&](const StepWork::Part& part) {
    Slot s;
    for (const auto& [op, st] : part.ops)
      s.compute += op_kind(op) == OpKind::gemm        ? st.flops / gemm
                   : op_kind(op) == OpKind::attention ? st.flops / m.attention_flops
                                                      : st.bytes / m.copy_bytes;
    const Comm mb = comm_seconds(part);
    // On a device the data-parallel collectives a micro-batch issues (ZeRO-3's gathers, overlap_comm's
    // reductions) run on their own stream beside its compute; tp's sit between its GEMMs. On a CPU the
    // collectives run on the cores that compute.
    s.tp = mb.tp, s.dp = m.device && c.zero.overlap_comm ? std::max(0.0, mb.dp - s.compute) : mb.dp;
    const double fill = params_in ? std::max(par_swapped ? disk(part.param_read, 0) : 0.0,
                                             m.device ? static_cast<double>(part.param_read) / m.pcie_bytes : 0.0)
                                  : 0.0;
    s.fill = std::max(0.0, fill - s.compute);
    return s;
  };
  const int gas = c.gradient_accumulation_steps;
  StepTime t;
  double slowest_mbs = 0, slowest_end = 0, once = 0, ahead_s = 0, slices_s = 0;
  for (int p = 0; p < c.pp_size; ++p) {
    const StepWork w = count_step(c, dp, p);
    double sends = 0;  // activations in and gradients out, per neighbour, over the node's link or the network
    for (int b : {p - 1, p})
      if (b >= 0 && b < c.pp_size - 1) {
        const bool across = topo.stage_boundary_across_nodes(b, R) && m.inter_node.p2p_bytes > 0;
        sends += 2 * act_bytes / (across ? m.inter_node.p2p_bytes : m.p2p_bytes > 0 ? m.p2p_bytes : m.copy_bytes);
        t.pp_across = t.pp_across || across;
      }
    // The step's micro-batches on this stage: the first, then gas - 1 like the later one.
    const Slot first = slot(w.micro_batch), later = gas > 1 ? slot(w.later_micro_batch) : Slot{};
    Slot all;
    all.compute = first.compute + (gas - 1) * later.compute, all.tp = first.tp + (gas - 1) * later.tp;
    all.fill = first.fill + (gas - 1) * later.fill;
    const double last_dp = gas > 1 ? later.dp : first.dp;  // ZeRO-0/1: the reduction, once
    all.dp = reduce_once ? 0 : first.dp + (gas - 1) * later.dp;
    const double mbs = all.compute + all.tp + all.dp + all.fill + gas * sends;
    const Comm end_comm = comm_seconds(w.step_end);
    double end = end_comm.dp + end_comm.tp, update = 0, link_s = 0;
    for (const auto& [op, st] : w.step_end.ops) {
      if (op != "adam_step") {
        end += st.bytes / m.copy_bytes;
      } else if (!link) {
        update += st.bytes / m.adam_bytes;
      } else {  // the gradients down (fp32), the weights up (16-bit in mixed precision) beside the CPU's update
        const double n = st.bytes / math::kAdamBytesPerElement;
        link_s += n * (4 + (c.precision == Precision::fp32 ? 4 : 2)) / m.pcie_bytes;
        update += st.bytes / m.host_adam_bytes;
      }
    }
    // The optimizer's swap file: its records are read and written beside the update, but for those
    // read ahead for the next step (behind its forward and backward); the parameters' slices are
    // written as the update hands them over.
    const StepWork::Part& e = w.step_end;
    const double ahead = opt_swapped ? disk(w.read_ahead, 0) : 0.0;
    const double opt_disk = opt_swapped ? disk(e.swap_read - e.param_read, e.swap_written - e.param_written) - ahead : 0.0;
    const double param_disk = par_swapped ? disk(e.param_read, e.param_written) : 0.0;
    const double offload_s = std::max({update, link_s, std::max(0.0, opt_disk)}) + param_disk;
    end += offload_s;
    if (mbs > slowest_mbs)
      slowest_mbs = mbs, t.compute_s = all.compute, t.tp_s = all.tp, t.dp_s = all.dp, t.pp_s = gas * sends,
      t.param_io_s = all.fill,
      slices_s = par_swapped ? disk(w.micro_batch.param_read + (gas - 1) * w.later_micro_batch.param_read, 0) : 0.0;
    if (end > slowest_end)
      slowest_end = end, t.end_collectives_s = end_comm.dp + end_comm.tp,
      t.offload_s = link || opt_swapped || par_swapped ? offload_s : 0, ahead_s = ahead;
    if (reduce_once) once = std::max(once, last_dp);
  }
  t.dp_s += once;
  t.tp_across = tp_span > 0, t.dp_across = dp_span > 0;
  t.comm_s = t.tp_s + t.dp_s + t.pp_s;
  t.bubble_s = (c.pp_size - 1) * slowest_mbs / gas;  // pp - 1 slots of the slowest stage's mean micro-batch
  // The reads ahead wait only where they outlast the next step's micro-batches, less the disk's time
  // for the parameter slices those read.
  const double ahead_exposed =
      ahead_s > 0 ? std::max(0.0, ahead_s + slices_s - (t.compute_s + t.comm_s + t.param_io_s + t.bubble_s)) : 0.0;
  t.step_end_s = slowest_end + ahead_exposed;
  if (t.offload_s > 0) t.offload_s += ahead_exposed;
  return t;
}

namespace {

// Each pipeline stage's rank, and the one that needs the most.
std::vector<RankMemory> size_stages(const Config& c, int dp, MemKind kind, RankMemory& worst) {
  std::vector<RankMemory> stages;
  for (int p = 0; p < c.pp_size; ++p) {
    stages.push_back(size_rank(c, dp, p, kind));
    if (p == 0 || stages.back().total() > worst.total()) worst = stages.back();
  }
  return stages;
}

std::string gigabytes(uint64_t b) { return strprintf("%.3f GB", b / 1e9); }

}  // namespace

std::vector<PlanLayout> plan_layouts(const ConfigSources& sources, int ranks, uint64_t mem_per_rank, MemKind kind,
                                     const MachineRates* machine) {
  const Config base = load_config(sources, 1);  // the global batch and everything the plan keeps
  const int tb = base.train_batch_size;
  // Optimizer offload: to host memory from a device (on a CPU the state is there already), to nvme
  // where the config names a directory for swap files.
  const std::string nvme_path = !base.zero.offload_optimizer.nvme_path.empty() ? base.zero.offload_optimizer.nvme_path
                                                                               : base.zero.offload_param.nvme_path;
  std::vector<OffloadDevice> offloads = {OffloadDevice::none};
  if (kind == MemKind::device) offloads.push_back(OffloadDevice::cpu);
  if (!nvme_path.empty()) offloads.push_back(OffloadDevice::nvme);
  std::vector<PlanLayout> out;
  for (int tp = 1; tp <= ranks; ++tp) {
    if (ranks % tp) continue;
    for (int pp = 1; tp * pp <= ranks; ++pp) {
      if (ranks % (tp * pp)) continue;
      const int dp = ranks / (tp * pp);
      for (int stage = 0; stage <= 3; ++stage)
        for (int micro = 1; micro <= tb; ++micro) {
          if (tb % micro || (tb / micro) % dp) continue;
          const int gas = tb / micro / dp;
          for (const OffloadDevice offload : offloads)
            for (const bool ckpt : {false, true}) {
              if (offload != OffloadDevice::none && stage == 0) continue;
              PlanLayout l;
              l.dp = dp, l.tp = tp, l.pp = pp, l.stage = stage, l.micro = micro, l.gas = gas, l.checkpointing = ckpt;
              l.offload = offload;
              if (offload == OffloadDevice::nvme) l.nvme_path = nvme_path;
              ConfigSources s = sources;
              for (std::string kv : {"tensor_parallel.tp_size=" + std::to_string(tp),
                                     "pipeline_parallel.pp_size=" + std::to_string(pp),
                                     "zero_optimization.stage=" + std::to_string(stage),
                                     "train_batch_size=" + std::to_string(tb),
                                     "train_micro_batch_size_per_gpu=" + std::to_string(micro),
                                     "gradient_accumulation_steps=" + std::to_string(gas),
                                     std::string("activation_checkpointing.enabled=") + (ckpt ? "true" : "false")})
                s.overrides.push_back(kv);
              s.overrides.push_back("zero_optimization.offload_optimizer.device=" + offload_device_name(offload));
              if (offload == OffloadDevice::nvme)
                s.overrides.push_back("zero_optimization.offload_optimizer.nvme_path=" + nvme_path);
              try {
                const Config c = load_config(s, ranks);
                l.stages = size_stages(c, dp, kind, l.worst);
                l.fits = mem_per_rank == 0 || l.worst.total() <= mem_per_rank;
                if (machine && prices(*machine, c)) {
                  l.time = price_step(c, dp, *machine);
                  l.tokens_per_s = static_cast<double>(tb) * c.model.seq_len / l.time.step_s();
                }
              } catch (const UserError& e) {
                l.excluded = e.what();
              }
              out.push_back(std::move(l));
            }
        }
    }
  }
  return out;
}

std::string explain_layout(const ConfigSources& sources, int ranks, uint64_t limit, MemKind kind,
                           const MachineRates* machine) {
  const Config c = load_config(sources, ranks);
  const int dp = ranks / (c.tp_size * c.pp_size);
  RankMemory w;
  size_stages(c, dp, kind, w);
  std::string out = strprintf(
      "layout   dp %d x tp %d x pp %d on %d ranks, ZeRO stage %d, micro-batch %d x %d accumulation steps, activation "
      "checkpointing %s\n",
      dp, c.tp_size, c.pp_size, ranks, c.zero.stage, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps,
      c.activation_checkpointing ? "on" : "off");
  const std::pair<const char*, uint64_t> parts[] = {{"params", w.params},           {"grads", w.grads},
                                                    {"optimizer state", w.optimizer}, {"buffers", w.buffers},
                                                    {"activations", w.activations}, {"other", w.other}};
  std::string list;
  const char* largest = parts[0].first;
  uint64_t most = 0;
  for (const auto& [name, b] : parts) {
    list += strprintf("%s%s %s", list.empty() ? "" : ", ", name, gigabytes(b).c_str());
    if (b > most) most = b, largest = name;
  }
  out += strprintf("memory   per rank (pipeline stage %d, the one that needs the most): %s; total %s", w.pp_rank,
                   list.c_str(), gigabytes(w.total()).c_str());
  if (limit)
    out += w.total() > limit ? strprintf(", over the %s available by %s", gigabytes(limit).c_str(),
                                         gigabytes(w.total() - limit).c_str())
                             : strprintf(", within the %s available", gigabytes(limit).c_str());
  out += strprintf("; the largest part: %s (%.0f%%)", largest, 100.0 * most / std::max<uint64_t>(1, w.total()));
  if (w.host) out += strprintf("; in host memory besides (offload) %s", gigabytes(w.host).c_str());
  if (w.swapped) out += strprintf("; in swap files (nvme) %s", gigabytes(w.swapped).c_str());
  out += "\n";
  const StepWork work = count_step(c, dp, w.pp_rank);  // what the step-time model is to price
  double gemm = 0, attention = 0, bytes = 0;
  for (const auto& [op, st] : work.micro_batch.ops) {
    const OpKind k = op_kind(op);
    if (k == OpKind::gemm) gemm += st.flops;
    else if (k == OpKind::attention) attention += st.flops;
    else bytes += st.bytes;
  }
  auto collectives = [](const StepWork::Part& p) {
    std::string text;
    for (const auto& [what, st] : p.comms)
      if (st.group_size > 1)
        text += strprintf("; %s %lld x %.2f MB", what.c_str(), static_cast<long long>(st.calls),
                          st.msg_bytes / 1e6 / std::max<int64_t>(1, st.calls));
    return text;
  };
  double end_bytes = 0;
  for (const auto& [op, st] : work.step_end.ops) end_bytes += st.bytes;
  auto swap = [](const StepWork::Part& p) {
    return p.swap_read + p.swap_written == 0
               ? std::string()
               : strprintf("; swap files read %.3f MB, written %.3f MB", p.swap_read / 1e6, p.swap_written / 1e6);
  };
  // The later micro-batches compute the same; what they gather and read can differ (the pool keeps).
  const std::string later =
      c.gradient_accumulation_steps < 2
          ? ""
          : strprintf(" | each of the %d later micro-batches: the same ops%s%s", c.gradient_accumulation_steps - 1,
                      collectives(work.later_micro_batch).c_str(), swap(work.later_micro_batch).c_str());
  out += strprintf("work     per micro-batch, forward and backward, on that stage's rank: GEMM %.3f GFLOP, "
                   "attention %.3f GFLOP, the other ops %.3f GB%s%s%s | then per step: %.3f GB (gradients, "
                   "optimizer)%s%s\n",
                   gemm / 1e9, attention / 1e9, bytes / 1e9, collectives(work.micro_batch).c_str(),
                   swap(work.micro_batch).c_str(), later.c_str(), end_bytes / 1e9, collectives(work.step_end).c_str(),
                   swap(work.step_end).c_str());
  if (machine && prices(*machine, c)) {
    const StepTime t = price_step(c, dp, *machine);
    const double tokens = static_cast<double>(c.train_batch_size) * c.model.seq_len / t.step_s();
    auto where = [](bool across) { return across ? "across nodes" : "in a node"; };
    out += strprintf("time     on %s: step %.4g s = compute %.4g + communication %.4g (tp %.4g %s, dp %.4g %s, "
                     "pipeline sends %.4g %s) + offloaded parameters' waits %.4g + bubble %.4g + step end %.4g (its "
                     "collectives %.4g, offload %.4g); %.6g tokens/s, %.4g model TFLOP/s a rank\n",
                     machine->name.c_str(), t.step_s(), t.compute_s, t.comm_s, t.tp_s, where(t.tp_across), t.dp_s,
                     where(t.dp_across), t.pp_s, where(t.pp_across), t.param_io_s, t.bubble_s, t.step_end_s,
                     t.end_collectives_s, t.offload_s, tokens, tokens * gpt_flops_per_token(c.model) / ranks / 1e12);
  }

  // The seed's checklist, each change alone, sized like the layout itself.
  const int m = c.train_micro_batch_size_per_gpu, g = c.gradient_accumulation_steps;
  std::vector<std::vector<std::string>> changes;
  for (int st = c.zero.stage + 1; st <= 3; ++st) changes.push_back({"zero_optimization.stage=" + std::to_string(st)});
  if (!c.activation_checkpointing) changes.push_back({"activation_checkpointing.enabled=true"});
  for (int k = 2; k <= m; k *= 2)
    if (m % k == 0)
      changes.push_back({"train_micro_batch_size_per_gpu=" + std::to_string(m / k),
                         "gradient_accumulation_steps=" + std::to_string(g * k)});
  if (dp % 2 == 0) {  // the same global batch on half the data-parallel ranks: twice the accumulation
    changes.push_back({"tensor_parallel.tp_size=" + std::to_string(2 * c.tp_size),
                       "gradient_accumulation_steps=" + std::to_string(2 * g)});
    changes.push_back({"pipeline_parallel.pp_size=" + std::to_string(2 * c.pp_size),
                       "gradient_accumulation_steps=" + std::to_string(2 * g)});
  }
  std::vector<std::pair<uint64_t, std::string>> rows;
  for (const auto& change : changes) {
    ConfigSources s = sources;
    std::string what;
    for (const std::string& kv : change) s.overrides.push_back(kv), what += (what.empty() ? "" : " ") + ("--set " + kv);
    try {
      const Config v = load_config(s, ranks);
      RankMemory vw;
      size_stages(v, ranks / (v.tp_size * v.pp_size), kind, vw);
      rows.push_back({vw.total(), strprintf("  %-84s %s%s", what.c_str(), gigabytes(vw.total()).c_str(),
                                            limit && vw.total() <= limit ? "  fits" : "")});
    } catch (const UserError&) {  // a change the config code refuses is no advice
    }
  }
  std::sort(rows.begin(), rows.end());
  out += "what to change, each alone (the total per rank it leaves):\n";
  for (const auto& r : rows) out += r.second + "\n";
  if (rows.empty()) out += "  nothing the config code accepts on these ranks: more ranks, or offload\n";
  return out;
}

namespace {

uint64_t read_u64(const std::string& path) {  // a number alone in a file; 0 if none ("max")
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return 0;
  unsigned long long v = 0;
  const int got = std::fscanf(f, "%llu", &v);
  std::fclose(f);
  return got == 1 ? v : 0;
}

// Bytes this process's node can still give: MemAvailable, and the cgroup v2 limit less its anonymous
// memory (its page cache is reclaimed before an OOM kill, as MemAvailable counts it).
uint64_t available_memory() {
  uint64_t avail = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb * 1024;
    std::fclose(f);
  }
  uint64_t used = 0;
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/memory.stat", "r")) {
    char line[256];
    unsigned long long b = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "anon %llu", &b) == 1) used = b;
    std::fclose(f);
  }
  const uint64_t max = read_u64("/sys/fs/cgroup/memory.max");  // "max" (no limit) reads as 0
  if (max > 0) avail = avail ? std::min(avail, max > used ? max - used : 0) : (max > used ? max - used : 0);
  return avail;
}

}  // namespace

void refuse_if_over_memory(const Config& c, const ConfigSources& sources, ProcessGroups& g, MemKind kind) {
  if (kind != MemKind::host) return;  // a device reports its own allocation failures
  const RankMemory mine = size_rank(c, g.topo.dp, g.coord.pp, kind);
  std::unique_ptr<ProcessGroup> node = g.world->split_node("plan_node");
  const double planned = node->all_reduce_sum(static_cast<double>(mine.total()));
  const uint64_t avail = available_memory();
  const bool over = avail > 0 && planned > static_cast<double>(avail);
  g.world->agree([&] {
    if (!over || node->rank() != 0) return;
    std::string args = sources.config_file;
    if (!sources.deepspeed_file.empty()) args += " --deepspeed " + sources.deepspeed_file;
    for (const std::string& kv : sources.overrides) args += " --set " + kv;
    throw UserError(strprintf(
        "this layout needs %s on this node (%d ranks; zero3d plan's sizes, before the process's own), more than its "
        "%s available: it would be killed for memory midway. From zero3d plan %s --ranks %d --explain:\n%s",
        gigabytes(static_cast<uint64_t>(planned)).c_str(), node->size(), gigabytes(avail).c_str(), args.c_str(),
        g.topo.world,
        explain_layout(sources, g.topo.world, avail / node->size()).c_str()));
  });
}

namespace {

const char* kPlanUsage =
    "usage: zero3d plan CONFIG --ranks N [--mem-per-rank BYTES] [--machine FILE] [--device] [--top K]\n"
    "                   [--json | --explain | --sweep K [--ranks-per-node R]] [--deepspeed FILE] [--set k=v]...\n"
    "  Every layout of CONFIG's model and global batch on N ranks: tp x pp x dp, ZeRO stage 0-3, micro-batch and\n"
    "  gradient accumulation, activation checkpointing; each checked by the config code (why it is refused) and\n"
    "  sized by building its engine and models as a run does, on a backend that counts allocations without\n"
    "  memory: per rank params, grads, optimizer state, buffers (ZeRO's buckets, the stage-3 pool, the 16-bit\n"
    "  copies), activations (1F1B's in-flight micro-batches) and other, for the stage that needs the most.\n"
    "  --mem-per-rank BYTES (suffix K, M, G, T: powers of 1024): which fit. --top K rows (default 20; 0: all).\n"
    "  --device: the buffers in device memory, as a GPU run allocates them (the CUDA backend's own workspaces\n"
    "  not counted), with optimizer offload to host memory as one more choice (its host bytes apart).\n"
    "  A config naming zero_optimization.offload_optimizer.nvme_path: offload to nvme as one more choice,\n"
    "  its swap files sized (the nvme column, not in the total) without making them.\n"
    "  --machine FILE (zero3d bench machine's, or a GPU node's preset in input/machines/): each layout's\n"
    "  step time too, its work counted by running its model's and engine's code on the sizing backend\n"
    "  (--explain prints it) and priced at FILE's rates: compute, communication (over the network for a\n"
    "  group that spans nodes), 1F1B's bubble, the step's end; ranked by tokens/s (else by memory).\n"
    "  --json: one object per layout on stdout.\n"
    "  --sweep K: the first K layouts that fit as jobscripts/sweep.sh's LAYOUTS lines (strong scaling; NODES\n"
    "  from --ranks-per-node, default one node): zero3d plan ... --sweep 5 > layouts.txt.\n"
    "  --explain: CONFIG's own layout on N ranks part by part, and what each single change (ZeRO stage,\n"
    "  activation checkpointing, micro-batch, tp, pp) leaves per rank, and with --machine its step time;\n"
    "  a run whose node would need more than its available memory stops before it allocates and prints\n"
    "  the same.\n";

uint64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = s.substr(std::min(used, s.size()));
  const std::map<std::string, double> scale = {{"", 1}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0},
                                               {"T", 1099511627776.0}, {"KiB", 1024.0}, {"MiB", 1048576.0},
                                               {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  if (v <= 0 || !std::isfinite(v) || !scale.count(unit))
    throw UserError(strprintf("--mem-per-rank must be a positive number of bytes with an optional K, M, G or T, got "
                              "'%s'", s.c_str()));
  return static_cast<uint64_t>(v * scale.at(unit));
}

// Bytes in the table's unit: GB, or MB when every layout is under 1 GB.
double g_unit = 1e9;
std::string gb(uint64_t b) { return strprintf(g_unit == 1e9 ? "%.3f" : "%.2f", b / g_unit); }

}  // namespace

int cmd_plan(const Args& a) {
  ConfigSources src;
  int ranks = 0, top = 20;
  uint64_t mem = 0;
  bool json = false, explain = false;
  MemKind kind = MemKind::host;
  int sweep = 0, per_node = 0;  // --sweep K: sweep.sh's LAYOUTS lines; their nodes of --ranks-per-node
  std::optional<MachineRates> machine;  // --machine FILE: price each layout's step
  // Option a[i]'s value as a whole number of at least `least` (advances i).
  auto whole = [&](size_t& i, int least) {
    const std::string opt = a[i], v = option_value(a, i, kPlanUsage);
    const int n = !v.empty() && v.size() < 7 && v.find_first_not_of("0123456789") == std::string::npos ? std::stoi(v) : -1;
    if (n < least) throw UserError(strprintf("%s must be a whole number >= %d, got '%s'", opt.c_str(), least, v.c_str()));
    return n;
  };
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help" || a[i] == "-h") return log_info("%s", kPlanUsage), 0;
    if (a[i] == "--ranks") ranks = whole(i, 1);
    else if (a[i] == "--top") top = whole(i, 0);
    else if (a[i] == "--sweep") sweep = whole(i, 1);
    else if (a[i] == "--ranks-per-node") per_node = whole(i, 1);
    else if (a[i] == "--mem-per-rank") mem = parse_bytes(option_value(a, i, kPlanUsage));
    else if (a[i] == "--json") json = true;
    else if (a[i] == "--explain") explain = true;
    else if (a[i] == "--device") kind = MemKind::device;
    else if (a[i] == "--machine") machine = load_machine(option_value(a, i, kPlanUsage));
    else if (a[i] == "--set") src.overrides.push_back(option_value(a, i, kPlanUsage));
    else if (a[i] == "--deepspeed") src.deepspeed_file = option_value(a, i, kPlanUsage);
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kPlanUsage));
    else if (src.config_file.empty()) src.config_file = a[i];
    else throw UserError(strprintf("zero3d plan takes one config, got a second: '%s'", a[i].c_str()));
  }
  if (src.config_file.empty() || ranks == 0)
    throw UserError(strprintf("zero3d plan needs a config and --ranks N\n%s", kPlanUsage));
  if (ProcessGroup::world()->rank() != 0) return 0;
  if (explain) {
    log_info("%s", explain_layout(src, ranks, mem, kind, machine ? &*machine : nullptr).c_str());
    return 0;
  }

  std::vector<PlanLayout> all = plan_layouts(src, ranks, mem, kind, machine ? &*machine : nullptr);
  std::vector<const PlanLayout*> valid;
  std::map<std::string, int> reasons;
  for (const PlanLayout& l : all) {
    if (l.excluded.empty()) valid.push_back(&l);
    else ++reasons[l.excluded];
  }
  const bool timed = machine.has_value();  // ranked by tokens/s (unpriced last), else by memory
  std::stable_sort(valid.begin(), valid.end(), [&](const PlanLayout* x, const PlanLayout* y) {
    if (x->fits != y->fits) return x->fits;
    if (timed && x->tokens_per_s != y->tokens_per_s) return x->tokens_per_s > y->tokens_per_s;
    return x->worst.total() < y->worst.total();
  });
  // Without --ranks-per-node the ranks fill nodes of the machine's (a preset's 8 GPUs, bench machine's ranks).
  if (timed && (per_node ? per_node != machine->ranks_per_node : ranks % machine->ranks_per_node != 0))
    log_warn("zero3d plan: the machine file was measured with %d ranks a node, this plan has %d: its rates may not "
             "hold (measure it with the ranks a node will run)", machine->ranks_per_node, per_node ? per_node : ranks);
  if (timed && ranks > machine->ranks_per_node && machine->inter_node.collectives.empty())
    log_warn("zero3d plan: %d ranks fill more than one node of %d, and the machine file has no inter_node rates: groups "
             "across nodes are priced at the node's own", ranks, machine->ranks_per_node);
  if (per_node && ranks % per_node)
    throw UserError(strprintf("--ranks %d do not fill nodes of --ranks-per-node %d", ranks, per_node));
  if (sweep) {  // jobscripts/sweep.sh's LAYOUTS: NAME MODE NODES TP PP DP STAGE MICRO GAS [ARGS...]
    std::printf("# zero3d plan %s --ranks %d: the %d layouts that fit %s\n", src.config_file.c_str(), ranks, sweep,
                timed ? "with the most tokens/s predicted" : "with the least memory per rank (no --machine)");
    int n = 0;
    for (const PlanLayout* l : valid) {
      if (!l->fits) continue;
      if (n++ == sweep) break;
      std::string name = strprintf("t%dp%dd%d-s%d-m%dg%d", l->tp, l->pp, l->dp, l->stage, l->micro, l->gas), extra;
      if (l->checkpointing) name += "-ckpt", extra += " --set activation_checkpointing.enabled=true";
      if (l->offload != OffloadDevice::none) name += "-" + offload_device_name(l->offload);
      if (l->offload != OffloadDevice::none || l->stage > 0)  // the config's own choice may differ
        extra += " --set zero_optimization.offload_optimizer.device=" + offload_device_name(l->offload);
      if (!l->nvme_path.empty()) extra += " --set zero_optimization.offload_optimizer.nvme_path=" + l->nvme_path;
      std::printf("%-28s strong %3d %3d %3d %3d %d %4d %4d%s   # %s GB per rank\n", name.c_str(),
                  per_node ? ranks / per_node : 1, l->tp, l->pp, l->dp, l->stage, l->micro, l->gas, extra.c_str(),
                  strprintf("%.3f", l->worst.total() / 1e9).c_str());
    }
    return 0;
  }
  if (json) {
    for (const PlanLayout& l : all) {
      nlohmann::ordered_json j = {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"stage", l.stage}, {"micro", l.micro},
                                  {"gas", l.gas}, {"activation_checkpointing", l.checkpointing},
                                  {"offload_optimizer", offload_device_name(l.offload)}};
      if (!l.excluded.empty()) {
        j["excluded"] = l.excluded;
      } else {
        auto bytes = [](const RankMemory& r) {
          return nlohmann::ordered_json{{"pp_rank", r.pp_rank}, {"params", r.params}, {"grads", r.grads},
                                        {"optimizer", r.optimizer}, {"buffers", r.buffers},
                                        {"activations", r.activations}, {"other", r.other}, {"total", r.total()},
                                        {"host", r.host}, {"swapped", r.swapped}};
        };
        j["fits"] = l.fits;
        if (l.tokens_per_s > 0)
          j["time"] = {{"step_s", l.time.step_s()}, {"compute_s", l.time.compute_s}, {"comm_s", l.time.comm_s},
                       {"param_io_s", l.time.param_io_s}, {"bubble_s", l.time.bubble_s},
                       {"step_end_s", l.time.step_end_s},
                       {"tokens_per_s", l.tokens_per_s},
                       {"comm", {{"tp_s", l.time.tp_s}, {"dp_s", l.time.dp_s}, {"pp_s", l.time.pp_s},
                                 {"end_collectives_s", l.time.end_collectives_s}, {"offload_s", l.time.offload_s},
                                 {"tp_across_nodes", l.time.tp_across}, {"dp_across_nodes", l.time.dp_across},
                                 {"pp_across_nodes", l.time.pp_across}}}};
        j["worst"] = bytes(l.worst);
        j["stages"] = nlohmann::ordered_json::array();
        for (const RankMemory& r : l.stages) j["stages"].push_back(bytes(r));
      }
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  }
  uint64_t largest = mem;
  for (const PlanLayout* l : valid) largest = std::max(largest, l->worst.total());
  g_unit = largest < 1000000000 ? 1e6 : 1e9;
  const char* unit = g_unit == 1e9 ? "GB" : "MB";
  const size_t fit = static_cast<size_t>(std::count_if(valid.begin(), valid.end(), [](auto* l) { return l->fits; }));
  log_info("plan     %s on %d ranks: %zu layouts, %zu valid%s; memory per rank (%s) of the stage that needs the most, "
           "from the engine's and the models' own allocations; %s",
           src.config_file.c_str(), ranks, all.size(), valid.size(),
           mem ? strprintf(", %zu fit in %s %s", fit, gb(mem).c_str(), unit).c_str() : "", unit,
           timed ? strprintf("step time priced on %s (%s); ranked by tokens/s", machine->name.c_str(),
                             machine->measured.c_str()).c_str()
                 : "ranked by memory (--machine FILE: by predicted tokens/s)");
  // More columns where they say something: optimizer offload (a device's, or to nvme), what offload
  // puts in host memory (a device's), and in swap files.
  const bool dev = kind == MemKind::device;
  const bool offload_col = dev || std::any_of(all.begin(), all.end(), [](auto& l) { return l.offload != OffloadDevice::none; });
  const bool swap_col = std::any_of(valid.begin(), valid.end(), [](auto* l) { return l->worst.swapped > 0; });
  const std::string time_head = timed ? strprintf(" %8s %8s %8s %8s %9s", "step s", "comm", "bubble", "end", "tokens/s") : "";
  log_info("%4s %3s %3s %5s %5s %4s %4s%s %9s %9s %9s %9s %9s %9s %9s %5s%s%s %s%s", "dp", "tp", "pp", "stage", "micro",
           "gas", "ckpt", offload_col ? " offload" : "", "params", "grads", "optimizer", "buffers", "activ", "other",
           "total", "stage", dev ? strprintf(" %9s", "host").c_str() : "", swap_col ? strprintf(" %9s", "nvme").c_str() : "",
           mem ? "fits" : "", time_head.c_str());
  for (size_t k = 0; k < valid.size() && (top == 0 || k < static_cast<size_t>(top)); ++k) {
    const PlanLayout& l = *valid[k];
    const RankMemory& r = l.worst;
    const std::string time_cols =
        !timed ? ""
        : l.tokens_per_s > 0
            ? strprintf(" %8.4g %8.3g %8.3g %8.3g %9.0f", l.time.step_s(), l.time.comm_s, l.time.bubble_s,
                        l.time.step_end_s, l.tokens_per_s)
            : strprintf(" %8s", "-");
    log_info("%4d %3d %3d %5d %5d %4d %4s%s %9s %9s %9s %9s %9s %9s %9s %5d%s%s %s%s", l.dp, l.tp, l.pp, l.stage,
             l.micro, l.gas, l.checkpointing ? "yes" : "no",
             offload_col ? strprintf(" %7s", offload_device_name(l.offload).c_str()).c_str() : "", gb(r.params).c_str(),
             gb(r.grads).c_str(), gb(r.optimizer).c_str(), gb(r.buffers).c_str(), gb(r.activations).c_str(),
             gb(r.other).c_str(), gb(r.total()).c_str(), r.pp_rank, dev ? strprintf(" %9s", gb(r.host).c_str()).c_str() : "",
             swap_col ? strprintf(" %9s", gb(r.swapped).c_str()).c_str() : "", mem ? (l.fits ? "yes" : "no ") : "",
             time_cols.c_str());
  }
  if (top && valid.size() > static_cast<size_t>(top)) log_info("... %zu more (--top 0 shows all)", valid.size() - top);
  for (const auto& [why, n] : reasons) log_info("excluded %d: %s", n, why.c_str());
  return 0;
}

}  // namespace zero3d
