// The machine file reader of `zero3d plan --machine FILE` (bench/machine_file.cpp). Input: the
// file. What it accepts must survive the writer: saved by save_machine and read again, every rate
// is the same (else the harness traps: a finding).
#include "bench/machine.h"
#include "fuzz.h"

namespace {

bool same_links(const std::map<std::string, zero3d::MachineRates::Link>& a,
                const std::map<std::string, zero3d::MachineRates::Link>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [op, l] : a) {
    auto it = b.find(op);
    if (it == b.end() || it->second.latency_s != l.latency_s || it->second.busbw != l.busbw) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zero3d;
  const std::string path = fuzz::put_file("machine.json", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_user_errors([&] {
    const MachineRates m = load_machine(path);
    const std::string again = fuzz::scratch_dir() + "/again.json";
    save_machine(m, again);
    const MachineRates r = load_machine(again);
    const bool same = r.name == m.name && r.ranks_per_node == m.ranks_per_node && r.device == m.device &&
                      r.gemm_flops == m.gemm_flops && r.gemm_bf16_flops == m.gemm_bf16_flops &&
                      r.attention_flops == m.attention_flops && r.copy_bytes == m.copy_bytes &&
                      r.adam_bytes == m.adam_bytes && r.p2p_bytes == m.p2p_bytes && r.pcie_bytes == m.pcie_bytes &&
                      r.host_adam_bytes == m.host_adam_bytes && r.nvme_read_bytes == m.nvme_read_bytes &&
                      r.nvme_write_bytes == m.nvme_write_bytes && same_links(r.collectives, m.collectives) &&
                      r.inter_node.p2p_bytes == m.inter_node.p2p_bytes &&
                      same_links(r.inter_node.collectives, m.inter_node.collectives);
    if (!same) __builtin_trap();  // a file it accepted does not survive its own writer
  });
  return 0;
}
