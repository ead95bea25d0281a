// app/eval.cpp: zero3d eval, the loss and perplexity of a checkpoint's model on a token file or on
// text through the run's tokenizer, on one process and the host backend.
#include <cmath>
#include <cstdio>
#include <optional>

#include "app/commands.h"
#include "ckpt/tokenizer_record.h"
#include "ckpt/tools.h"
#include "core/check.h"
#include "core/log.h"
#include "core/posix_io.h"
#include "core/stop_signal.h"
#include "data/loader.h"
#include "kernels/backend.h"
#include "model/flat_layout.h"
#include "model/gpt.h"
#include "model/param_store.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

const char* kEvalUsage =
    "usage: zero3d eval CKPT (--tokens FILES | --text FILE...) [--tokenizer FILE|byte] [--batches N] [--micro-batch B]\n"
    "  The loss and perplexity of the checkpoint's model on llm.c token files (a file, a glob or a comma-separated\n"
    "  list, as data.val), their sequences in file order,\n"
    "  on one process (the host backend): N batches of B sequences (default: every whole batch; B 8).\n"
    "  --text FILE...   text files instead, each one document, tokenized as data prepare does with the run's\n"
    "                   tokenizer (recorded in the checkpoint; --tokenizer names another)\n";


}  // namespace

int cmd_eval(const Args& a) {
  std::string path, file, tokenizer_spec;
  std::vector<std::string> texts;
  int64_t batches = 0;
  int micro = 8;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help" || a[i] == "-h") return log_info("%s", kEvalUsage), 0;
    if (a[i] == "--tokens") file = option_value(a, i, kEvalUsage);
    else if (a[i] == "--text") {
      texts.push_back(option_value(a, i, kEvalUsage));
      while (i + 1 < a.size() && !a[i + 1].starts_with("-")) texts.push_back(a[++i]);
    } else if (a[i] == "--tokenizer") tokenizer_spec = option_value(a, i, kEvalUsage);
    else if (a[i] == "--batches") batches = parse_whole(option_value(a, i, kEvalUsage), "--batches", 0, INT64_MAX);
    else if (a[i] == "--micro-batch") micro = static_cast<int>(parse_whole(option_value(a, i, kEvalUsage), "--micro-batch", 1, 1 << 20));
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kEvalUsage));
    else if (path.empty()) path = a[i];
    else throw UserError(strprintf("zero3d eval takes one checkpoint, got a second: '%s'", a[i].c_str()));
  }
  if (path.empty() || file.empty() == texts.empty())
    throw UserError(strprintf("zero3d eval needs a checkpoint and one of --tokens FILE or --text FILE...\n%s", kEvalUsage));
  catch_interrupts();
  if (ProcessGroup::world()->rank() != 0) return 0;
  const CheckpointModel cm = read_checkpoint_model(path);
  const ModelConfig& m = cm.model;
  // The sequences: from the token file (DataLoader, file order), or cut from the text's tokens the same way.
  const size_t T = static_cast<size_t>(m.seq_len);
  std::optional<DataLoader> data;
  std::vector<int32_t> text;
  uint64_t sequences = 0;
  std::string source = file;
  if (!file.empty()) {
    data.emplace(file, m.seq_len, m.vocab_size, 0, false, "--tokens");
    sequences = data->num_sequences();
  } else {
    const CheckpointTokenizer tok = checkpoint_tokenizer(cm.file, cm.tokenizer, m.vocab_size, tokenizer_spec);
    for (const std::string& f : texts) tok.tokenizer->encode_document(read_text_file(f, "text file"), text);
    sequences = sequences_in(text.size(), m.seq_len);
    source = texts.size() == 1 ? texts[0] : strprintf("%zu text files", texts.size());
  }
  auto load = [&](uint64_t first, int count, int32_t* in, int32_t* tgt) {
    if (data) return data->load(first, count, in, tgt);
    for (size_t k = 0; k < static_cast<size_t>(count); ++k)
      cut_sequence(text.data() + (first + k) * T, T, in + k * T, tgt + k * T);
  };
  const int B = micro;
  const uint64_t whole = sequences / static_cast<uint64_t>(B);
  if (whole == 0)
    throw UserError(strprintf("'%s' holds %llu sequences of %d tokens, fewer than one batch of %d (--micro-batch)",
                              source.c_str(), (unsigned long long)sequences, m.seq_len, B));
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
    throw_if_interrupted("eval");
    load(k * B, B, in.data(), tgt.data());
    sum += model.forward(in.data(), tgt.data(), 0.0f);
  }
  const double loss = sum / static_cast<double>(n);
  std::printf("{\"kind\": \"eval\", \"checkpoint\": \"%s\", \"step\": %lld, \"%s\": \"%s\", \"sequences\": %llu, "
              "\"tokens\": %llu, \"loss\": %.9g, \"perplexity\": %.9g}\n",
              path.c_str(), (long long)cm.step, data ? "tokens_file" : "text", source.c_str(), (unsigned long long)(n * B),
              (unsigned long long)(n * B * m.seq_len), loss, std::exp(loss));
  std::fflush(stdout);
  log_info("zero3d: eval of step %lld on %llu sequences of '%s': loss %.6f, perplexity %.4f%s", (long long)cm.step,
           (unsigned long long)(n * B), source.c_str(), loss, std::exp(loss),
           n < whole || sequences % B ? " (whole batches only)" : "");
  return 0;
}

}  // namespace zero3d
