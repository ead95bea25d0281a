#include "plan/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "bench/machine.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "kernels/backend.h"
#include "kernels/math/adamw.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/groups.h"
#include "parallel/schedule.h"
#include "parallel/topology.h"
#include "storage/swap_file.h"
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
    const int slots = one_f_one_b_in_flight(pp_rank, c.pp_size, c.gradient_accumulation_steps);
    for (int k = 0; k < slots; ++k)
      models.push_back(std::make_unique<GPT>(*be, c.model, c.train_micro_batch_size_per_gpu, engine,
                                             gpt_options(c, kind == MemKind::device, slots), &tp_group, stage));
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
  GPT model(*be, c.model, c.train_micro_batch_size_per_gpu, engine, gpt_options(c, false), &tp_group,
            pipeline_stage(c.model, c.pp_size, pp_rank));
  // The sizing backend's copies move no bytes, so the micro-batch's tokens are never read: one
  // stands for them (a micro-batch of 10^9 sequences is sized, not allocated).
  const int32_t token = 0;
  const double tokens = static_cast<double>(c.train_micro_batch_size_per_gpu) * c.model.seq_len;
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
      model.forward(&token, &token, static_cast<float>(1.0 / tokens));
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
              throw_if_interrupted("plan");
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

}  // namespace zero3d
