// app/generate.cpp: zero3d generate, a checkpoint's model continuing a prompt on one process and
// the host backend (model/decode.h).
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <span>

#include "app/commands.h"
#include "ckpt/tokenizer_record.h"
#include "ckpt/tools.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "kernels/backend.h"
#include "model/decode.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

const char* kGenerateUsage =
    "usage: zero3d generate CKPT [--prompt TEXT | --prompt-ids ID,ID,...] [--max-tokens N] [--temperature T]\n"
    "                            [--top-k K] [--seed S] [--ids] [--tokenizer FILE|byte]\n"
    "  Continues a prompt with the checkpoint's model, one token at a time with a KV cache, on one process\n"
    "  (the host backend). Text goes through the run's tokenizer (data.tokenizer, recorded in the checkpoint):\n"
    "  the prompt follows the token that began every training document (bos, else eos; none for byte), and\n"
    "  generation stops early at the end-of-text token.\n"
    "  --tokenizer F    the tokenizer for text: a tokenizer.json, a tokenizer.model or byte (default: the recorded)\n"
    "  --max-tokens N   tokens to add (default 64; the model's seq_len ends the context)\n"
    "  --temperature T  0: the most likely token each time; else sample from softmax(logits / T) (default 1)\n"
    "  --top-k K        sample among the K most likely (default 0: all)\n"
    "  --seed S         the sampling's seed (default 1234)\n"
    "  --ids            print token ids instead of text\n"
    "  The text goes to standard output, a summary line to standard error.\n";

}  // namespace

int cmd_generate(const Args& a) {
  std::string path, prompt, ids_text, prompt_option;  // prompt_option: --prompt or --prompt-ids, whichever came
  double temperature = 1.0;
  int max_tokens = 64, top_k = 0;
  uint64_t seed = 1234;
  bool print_ids = false;
  std::string tokenizer_spec;
  auto take_prompt = [&](size_t& i, std::string& into) {
    if (!prompt_option.empty())
      throw UserError(strprintf("zero3d generate takes one prompt: %s or %s, not both (or twice)", prompt_option.c_str(),
                                a[i].c_str()));
    prompt_option = a[i];
    into = option_value(a, i, kGenerateUsage);
  };
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help" || a[i] == "-h") return log_info("%s", kGenerateUsage), 0;
    if (a[i] == "--prompt") take_prompt(i, prompt);
    else if (a[i] == "--prompt-ids") take_prompt(i, ids_text);
    else if (a[i] == "--max-tokens") max_tokens = static_cast<int>(parse_whole(option_value(a, i, kGenerateUsage), "--max-tokens", 0, INT32_MAX));
    else if (a[i] == "--temperature") temperature = parse_number(option_value(a, i, kGenerateUsage), "--temperature");
    else if (a[i] == "--top-k") top_k = static_cast<int>(parse_whole(option_value(a, i, kGenerateUsage), "--top-k", 0, INT32_MAX));
    else if (a[i] == "--seed") seed = static_cast<uint64_t>(parse_whole(option_value(a, i, kGenerateUsage), "--seed", 0, INT64_MAX));
    else if (a[i] == "--ids") print_ids = true;
    else if (a[i] == "--tokenizer") tokenizer_spec = option_value(a, i, kGenerateUsage);
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kGenerateUsage));
    else if (path.empty()) path = a[i];
    else throw UserError(strprintf("zero3d generate takes one checkpoint, got a second: '%s'", a[i].c_str()));
  }
  if (path.empty()) throw UserError(strprintf("zero3d generate needs a checkpoint\n%s", kGenerateUsage));
  if (prompt_option.empty()) throw UserError(strprintf("zero3d generate needs --prompt or --prompt-ids\n%s", kGenerateUsage));
  if (temperature < 0) throw UserError(strprintf("--temperature must be >= 0, got %g", temperature));
  catch_interrupts();
  if (ProcessGroup::world()->rank() != 0) return 0;  // one process is enough
  const CheckpointModel cm = read_checkpoint_model(path);
  // Text in or out needs the tokenizer. Ids in with none known (nothing recorded, no --tokenizer): ids out.
  const bool text_in = ids_text.empty(), unknown = tokenizer_spec.empty() && cm.tokenizer.empty();
  const bool ids_for_want_of_tokenizer = !text_in && unknown && !print_ids;
  if (ids_for_want_of_tokenizer) print_ids = true;
  std::optional<CheckpointTokenizer> tok;
  if (text_in || !print_ids) tok = checkpoint_tokenizer(cm.file, cm.tokenizer, cm.model.vocab_size, tokenizer_spec);
  std::vector<int32_t> tokens;
  if (!ids_text.empty()) {
    for (const std::string& item : split_commas(ids_text))
      tokens.push_back(static_cast<int32_t>(parse_whole(item, "each of --prompt-ids", 0, cm.model.vocab_size - 1)));
  } else {
    tok->tokenizer->encode_document(prompt, tokens);
    if (tokens.size() == (tok->tokenizer->document_separator() >= 0 ? 1u : 0u)) throw UserError("the prompt is empty");
  }
  if (tokens.empty()) throw UserError("the prompt is empty");
  if (static_cast<int>(tokens.size()) > cm.model.seq_len)
    throw UserError(strprintf("the prompt has %zu tokens; the model's context is %d", tokens.size(), cm.model.seq_len));
  auto be = make_host_backend();
  Decoder dec(*be, cm.model, cm.tensors);
  const std::vector<float>* logits = nullptr;
  for (int32_t t : tokens) logits = &dec.step(t);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const size_t prompt_len = tokens.size();
  // A document ends at the end-of-text token (or where the next one would begin).
  const int eos = tok ? tok->tokenizer->eos_id() : -1, sep = tok ? tok->tokenizer->document_separator() : -1;
  bool ended = false;
  for (int n = 0; n < max_tokens; ++n) {
    throw_if_interrupted("generate");
    tokens.push_back(sample_token(*logits, temperature, top_k, u(rng)));
    if (tokens.back() == eos || tokens.back() == sep) {  // sampled ids are >= 0: an absent eos (-1) never matches
      ended = true;
      break;
    }
    if (dec.position() == cm.model.seq_len) break;  // the context is full: no logits for another
    logits = &dec.step(tokens.back());
  }
  std::string out;
  if (print_ids) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(tokens[i]);
    }
  } else {  // the text of the prompt and what followed: the separator that began it and the end token are not text
    size_t first = 0, last = tokens.size();
    if (ids_text.empty() && sep >= 0) first = 1;
    if (ended) --last;
    out = tok->tokenizer->decode(std::span<const int32_t>(tokens.data() + first, last - first));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "zero3d: %zu prompt tokens + %zu generated (step %lld of '%s', %s, temperature %g, top-k %d%s%s)\n",
           prompt_len, tokens.size() - prompt_len, (long long)cm.step, path.c_str(), cm.model.arch.c_str(), temperature,
           top_k,
           tok ? strprintf(", %s tokenizer %s", tok->kind.c_str(), tok->origin.c_str()).c_str()
           : ids_for_want_of_tokenizer ? "; ids printed: the checkpoint records no tokenizer (give --tokenizer)" : "",
           ended ? "; stopped at the end-of-text token"
           : static_cast<int>(tokens.size()) - 1 >= cm.model.seq_len ? "; stopped at the end of the context" : "");
  return 0;
}

}  // namespace zero3d
