// The llm.c token-file reader (data/loader.cpp) as training and eval open a file: the header (uint16
// or uint32 tokens), the size it promises, then the first batches of the shuffled and the file-order
// loader, every token id read checked against the vocabulary. Input: the file. The vocabulary is
// GPT-2's unless the low bit of header word 3 (unused by the format) is set: then 256, the byte
// tokenizer's, so both range checks are reached.
#include <fstream>
#include <iterator>
#include <vector>

#include "data/loader.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace zero3d;
  if (const std::string dir = fuzz::seed_request(); !dir.empty()) {  // the writer's own files
    const std::string text = fuzz::put_file("text.txt", "The quick brown fox jumps over the lazy dog.\n"
                                                        "zero3d: ZeRO stages 0-3 inside every pipeline stage.\n");
    prepare_token_file({text}, fuzz::scratch_dir() + "/bytes.bin");
    std::ifstream in(fuzz::scratch_dir() + "/bytes.bin", std::ios::binary);
    fuzz::write_seed(dir, "prepared.bin", std::string(std::istreambuf_iterator<char>(in), {}));
    // llm.c's uint32 format (its Llama 3 scripts).
    std::vector<int32_t> u32(kTokenFileHeaderInts + 40);
    u32[0] = kTokenFileMagicU32, u32[1] = kTokenFileVersionU32, u32[2] = 40;
    for (int i = 0; i < 40; ++i) u32[kTokenFileHeaderInts + i] = (i * 7919) % 50257;
    fuzz::write_seed(dir, "uint32.bin", std::string(reinterpret_cast<const char*>(u32.data()), u32.size() * 4));
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zero3d;
  const std::string path = fuzz::put_file("tokens.bin", std::string_view(reinterpret_cast<const char*>(data), size));
  const int vocab = size > 12 && (data[12] & 1) ? 256 : 50257;
  fuzz::expect_user_errors([&] {
    for (bool shuffle : {true, false}) {
      for (int seq_len : {1, 7}) {
        DataLoader loader(path, seq_len, vocab, 1234, shuffle);
        const int count = 3;
        std::vector<int32_t> inputs(count * seq_len), targets(count * seq_len);
        for (uint64_t first : {uint64_t{0}, loader.num_sequences() - 1, uint64_t{1} << 40})
          loader.load(first, count, inputs.data(), targets.data());
        for (size_t k = 0; k < inputs.size(); ++k)
          if (inputs[k] < 0 || inputs[k] >= vocab || targets[k] < 0 || targets[k] >= vocab) __builtin_trap();
      }
    }
  });
  return 0;
}
