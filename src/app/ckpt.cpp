// app/ckpt.cpp: zero3d ckpt inspect, verify and export (ckpt/tools.h), on rank 0 alone.
#include <optional>

#include "app/commands.h"
#include "ckpt/tools.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

const char* kCkptUsage =
    "usage: zero3d ckpt inspect CKPT\n"
    "       zero3d ckpt verify CKPT\n"
    "       zero3d ckpt export CKPT --out MODEL.safetensors [--weights master|model] [--format safetensors|hf]\n"
    "                               [--tokenizer FILE|byte]\n"
    "  CKPT: a checkpoint file (step_XXXXXXXX.h5), or a checkpoint directory meaning the one its 'latest' names.\n"
    "  inspect  print the step, the layout at save, the model shape, the optimizer state and every dataset\n"
    "  verify   recompute every dataset's checksum; exit code 4 when any differs, is missing or unreadable\n"
    "  export   write the model weights as safetensors (GPT-2 names without 'transformer.', matrices (out, in)):\n"
    "           --weights master (default) the fp32 master weights, F32; model: the weights computed with,\n"
    "           as stored (F32, BF16 or F16)\n"
    "           --format hf: --out names a directory; config.json and model.safetensors as Hugging Face\n"
    "           transformers loads them (GPT2LMHeadModel or LlamaForCausalLM), with the run's tokenizer\n"
    "           (tokenizer.json or tokenizer.model, tokenizer_config.json, generation_config.json; --tokenizer\n"
    "           names it for a checkpoint that records none) for AutoTokenizer and pipeline(). It appears\n"
    "           whole or not at all: an earlier export there is replaced only when the new one is complete; a directory\n"
    "           holding other files is refused. No output replaces what is not a regular file.\n"
    "  Runs on rank 0 alone; one process is enough.\n";

}  // namespace

int cmd_ckpt(const Args& a) {
  if (const std::optional<int> rc = usage_exit(a, kCkptUsage)) return *rc;
  const std::string& tool = a[0];
  if (tool != "inspect" && tool != "verify" && tool != "export")
    throw UserError(strprintf("unknown ckpt command '%s' (inspect, verify or export)\n%s", tool.c_str(), kCkptUsage));
  std::string path, out, weights = "master", format = "safetensors", tokenizer;
  for (size_t i = 1; i < a.size(); ++i) {
    if (tool == "export" && a[i] == "--out") out = option_value(a, i, kCkptUsage);
    else if (tool == "export" && a[i] == "--weights") weights = option_value(a, i, kCkptUsage);
    else if (tool == "export" && a[i] == "--format") format = option_value(a, i, kCkptUsage);
    else if (tool == "export" && a[i] == "--tokenizer") tokenizer = option_value(a, i, kCkptUsage);
    else if (a[i].starts_with("-"))
      throw UserError(strprintf("unknown option '%s' for zero3d ckpt %s\n%s", a[i].c_str(), tool.c_str(), kCkptUsage));
    else if (path.empty()) path = a[i];
    else
      throw UserError(strprintf("zero3d ckpt %s takes one checkpoint, got a second: '%s'", tool.c_str(), a[i].c_str()));
  }
  if (path.empty())
    throw UserError(strprintf("zero3d ckpt %s needs a checkpoint file or directory\n%s", tool.c_str(), kCkptUsage));
  if (tool == "export" && out.empty())
    throw UserError(strprintf("zero3d ckpt export needs --out FILE\n%s", kCkptUsage));
  // One reader is enough: the other ranks return 0 and wait in main, which agrees on rank 0's code.
  catch_interrupts();
  if (ProcessGroup::world()->rank() != 0) return 0;
  if (tool == "inspect") return ckpt_inspect(path);
  if (tool == "verify") return ckpt_verify(path);
  if (!tokenizer.empty() && format != "hf")
    throw UserError("--tokenizer goes with --format hf (a safetensors file holds weights only)");
  return ckpt_export(path, out, weights, format, tokenizer);
}

}  // namespace zero3d
