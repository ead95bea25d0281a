// data/prepare.h: text files into llm.c token files through a tokenizer (zero3d data prepare).
// Each text file is one document, preceded by tokenizer.document_separator() (none for "byte"),
// as llm.c's data scripts write them. Tokens are uint16 (magic kTokenFileMagic, version 1) where
// the vocabulary fits, else llm.c's uint32 format (kTokenFileMagicU32, version 7).
//
// Invariant: the output is the same bytes whatever the thread count: documents are encoded on
// every core but written in input order. Every file appears whole or not at all, and all of them
// at the end (a failure or an interrupt leaves none of this run's files); none replaces an input.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zero3d {

struct PrepareOptions {
  std::vector<std::string> texts;  // the documents, in order
  // One file; or with shard_tokens, the prefix of PREFIX_000000.bin, PREFIX_000001.bin, ... (a
  // trailing ".bin" is dropped from it), each of shard_tokens tokens but the last.
  std::string out;
  uint64_t shard_tokens = 0;  // 0: one file
  int threads = 0;            // encoding threads; 0: every core
  bool progress = false;      // a progress line on stderr (input MB, tokens, MB/s)
};

struct PrepareResult {
  uint64_t tokens = 0;             // separators included
  uint64_t bytes = 0;              // of text read
  double seconds = 0;               // wall, from the first input read to the files committed
  double cpu_seconds = 0;           // of the process (all its threads) over the same span
  std::vector<std::string> files;  // written, in order
};

// Throws UserError naming the file: a missing or unreadable input, an output that is an input or
// cannot be written, a document the tokenizer reads whole that is over 1 GiB, a file over the
// format's 2^31 - 1 tokens (without shards).
PrepareResult prepare_tokens(const Tokenizer& tokenizer, const PrepareOptions& options);

}  // namespace zero3d
