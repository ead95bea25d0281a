// train/infer.cpp: zero3d generate and zero3d eval, a checkpoint's model on one process and the
// host backend (model/decode.h).
#include <cmath>
#include <cstdio>
#include <random>

#include "ckpt/tools.h"
#include "core/check.h"
#include "core/log.h"
#include "data/loader.h"
#include "kernels/backend.h"
#include "model/decode.h"
#include "model/flat_layout.h"
#include "model/gpt.h"
#include "model/param_store.h"
#include "parallel/comm.h"
#include "train/commands.h"

namespace zero3d {

namespace {

const char* kGenerateUsage =
    "usage: zero3d generate CKPT [--prompt TEXT | --prompt-ids ID,ID,...] [--max-tokens N] [--temperature T]\n"
    "                            [--top-k K] [--seed S] [--ids]\n"
    "  Continues a prompt with the checkpoint's model, one token at a time with a KV cache, on one process\n"
    "  (the host backend). Text is byte-level: each byte one token (the shipped corpus's tokenizer).\n"
    "  --max-tokens N   tokens to add (default 64; the model's seq_len ends the context)\n"
    "  --temperature T  0: the most likely token each time; else sample from softmax(logits / T) (default 1)\n"
    "  --top-k K        sample among the K most likely (default 0: all)\n"
    "  --seed S         the sampling's seed (default 1234)\n"
    "  --ids            print token ids instead of text\n"
    "  The text goes to standard output, a summary line to standard error.\n";

const char* kEvalUsage =
    "usage: zero3d eval CKPT --tokens FILE [--batches N] [--micro-batch B]\n"
    "  The loss and perplexity of the checkpoint's model on an llm.c token file, its sequences in file order,\n"
    "  on one process (the host backend): N batches of B sequences (default: every whole batch; B 8).\n";

double number(const std::string& s, const char* what) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  throw UserError(strprintf("%s must be a number, got '%s'", what, s.c_str()));
}

}  // namespace

int cmd_generate(const Args& a) {
  std::string path, prompt, ids_text;
  double max_tokens = 64, temperature = 1.0, top_k = 0, seed = 1234;
  bool print_ids = false, have_prompt = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help" || a[i] == "-h") return log_info("%s", kGenerateUsage), 0;
    if (a[i] == "--prompt") prompt = option_value(a, i, kGenerateUsage), have_prompt = true;
    else if (a[i] == "--prompt-ids") ids_text = option_value(a, i, kGenerateUsage), have_prompt = true;
    else if (a[i] == "--max-tokens") max_tokens = number(option_value(a, i, kGenerateUsage), "--max-tokens");
    else if (a[i] == "--temperature") temperature = number(option_value(a, i, kGenerateUsage), "--temperature");
    else if (a[i] == "--top-k") top_k = number(option_value(a, i, kGenerateUsage), "--top-k");
    else if (a[i] == "--seed") seed = number(option_value(a, i, kGenerateUsage), "--seed");
    else if (a[i] == "--ids") print_ids = true;
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kGenerateUsage));
    else if (path.empty()) path = a[i];
    else throw UserError(strprintf("zero3d generate takes one checkpoint, got a second: '%s'", a[i].c_str()));
  }
  if (path.empty()) throw UserError(strprintf("zero3d generate needs a checkpoint\n%s", kGenerateUsage));
  if (!have_prompt) throw UserError(strprintf("zero3d generate needs --prompt or --prompt-ids\n%s", kGenerateUsage));
  if (max_tokens < 0 || temperature < 0 || top_k < 0 || max_tokens != std::floor(max_tokens) || top_k != std::floor(top_k))
    throw UserError("--max-tokens and --top-k must be whole numbers >= 0, --temperature >= 0");
  if (ProcessGroup::world()->rank() != 0) return 0;  // one process is enough
  const CheckpointModel cm = read_checkpoint_model(path);
  std::vector<int32_t> tokens;
  if (!ids_text.empty()) {
    for (const std::string& item : split_commas(ids_text)) tokens.push_back(static_cast<int32_t>(number(item, "--prompt-ids")));
  } else {
    if (cm.model.vocab_size < 256)
      throw UserError(strprintf("--prompt is byte-level text, but the model's vocabulary has %d tokens (fewer than 256): "
                                "give --prompt-ids",
                                cm.model.vocab_size));
    for (unsigned char c : prompt) tokens.push_back(c);
  }
  if (tokens.empty()) throw UserError("the prompt is empty");
  if (static_cast<int>(tokens.size()) > cm.model.seq_len)
    throw UserError(strprintf("the prompt has %zu tokens; the model's context is %d", tokens.size(), cm.model.seq_len));
  auto be = make_host_backend();
  Decoder dec(*be, cm.model, cm.tensors);
  const std::vector<float>* logits = nullptr;
  for (int32_t t : tokens) logits = &dec.step(t);
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const size_t prompt_len = tokens.size();
  for (int n = 0; n < static_cast<int>(max_tokens); ++n) {
    tokens.push_back(sample_token(*logits, temperature, static_cast<int>(top_k), u(rng)));
    if (dec.position() == cm.model.seq_len) break;  // the context is full: no logits for another
    logits = &dec.step(tokens.back());
  }
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (print_ids) out += (i ? " " : "") + std::to_string(tokens[i]);
    else if (tokens[i] < 256) out += static_cast<char>(tokens[i]);
    else out += "<" + std::to_string(tokens[i]) + ">";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "zero3d: %zu prompt tokens + %zu generated (step %lld of '%s', %s, temperature %g, top-k %d%s)\n",
           prompt_len, tokens.size() - prompt_len, (long long)cm.step, path.c_str(), cm.model.arch.c_str(), temperature,
           static_cast<int>(top_k),
           static_cast<int>(tokens.size()) - 1 >= cm.model.seq_len ? "; stopped at the end of the context" : "");
  return 0;
}

int cmd_eval(const Args& a) {
  std::string path, file;
  double batches = 0, micro = 8;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help" || a[i] == "-h") return log_info("%s", kEvalUsage), 0;
    if (a[i] == "--tokens") file = option_value(a, i, kEvalUsage);
    else if (a[i] == "--batches") batches = number(option_value(a, i, kEvalUsage), "--batches");
    else if (a[i] == "--micro-batch") micro = number(option_value(a, i, kEvalUsage), "--micro-batch");
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kEvalUsage));
    else if (path.empty()) path = a[i];
    else throw UserError(strprintf("zero3d eval takes one checkpoint, got a second: '%s'", a[i].c_str()));
  }
  if (path.empty() || file.empty()) throw UserError(strprintf("zero3d eval needs a checkpoint and --tokens FILE\n%s", kEvalUsage));
  if (micro < 1 || batches < 0 || micro != std::floor(micro) || batches != std::floor(batches))
    throw UserError("--micro-batch must be a whole number >= 1, --batches >= 0");
  if (ProcessGroup::world()->rank() != 0) return 0;
  const CheckpointModel cm = read_checkpoint_model(path);
  const ModelConfig& m = cm.model;
  DataLoader data(file, m.seq_len, m.vocab_size, 0, false);
  const int B = static_cast<int>(micro);
  const uint64_t whole = data.num_sequences() / static_cast<uint64_t>(B);
  if (whole == 0)
    throw UserError(strprintf("'%s' holds %llu sequences of %d tokens, fewer than one batch of %d (--micro-batch)",
                              file.c_str(), (unsigned long long)data.num_sequences(), m.seq_len, B));
  const uint64_t n = batches > 0 ? std::min<uint64_t>(whole, static_cast<uint64_t>(batches)) : whole;
  auto be = make_host_backend();
  const std::vector<ParamInfo> table = gpt_param_table(m);
  FlatParamStore store(*be, make_flat_layout(table, 1, size_t{1} << 62));
  for (size_t i = 0; i < table.size(); ++i)
    be->copy_from_host(store.params() + store.layout().tensors[i].offset, cm.tensors[i].data(),
                       cm.tensors[i].size() * sizeof(float));
  GPT model(*be, m, B, store);
  std::vector<int32_t> in(static_cast<size_t>(B) * m.seq_len), tgt(in.size());
  double sum = 0;
  for (uint64_t k = 0; k < n; ++k) {
    data.load(k * B, B, in.data(), tgt.data());
    sum += model.forward(in.data(), tgt.data(), 0.0f);
  }
  const double loss = sum / static_cast<double>(n);
  std::printf("{\"kind\": \"eval\", \"checkpoint\": \"%s\", \"step\": %lld, \"tokens_file\": \"%s\", \"sequences\": %llu, "
              "\"tokens\": %llu, \"loss\": %.9g, \"perplexity\": %.9g}\n",
              path.c_str(), (long long)cm.step, file.c_str(), (unsigned long long)(n * B),
              (unsigned long long)(n * B * m.seq_len), loss, std::exp(loss));
  std::fflush(stdout);
  log_info("zero3d: eval of step %lld on %llu sequences of '%s': loss %.6f, perplexity %.4f%s", (long long)cm.step,
           (unsigned long long)(n * B), file.c_str(), loss, std::exp(loss),
           n < whole || data.num_sequences() % B ? " (whole batches only)" : "");
  return 0;
}

}  // namespace zero3d
