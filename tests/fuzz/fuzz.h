// tests/fuzz/fuzz.h: what the libFuzzer harnesses share. Each harness hands its bytes to one of
// zero3d's parsers as the command line would. A UserError (zero3d's exit 2) is the expected answer
// to a bad input; anything else (another exception, a crash, a sanitizer report, an exit) escapes
// and libFuzzer reports it. With ZERO3D_FUZZ_SEEDS=DIR in the environment a harness writes its
// seeds (valid inputs made by zero3d's own writers) into DIR and exits: see run.sh.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "core/check.h"

namespace zero3d::fuzz {

// A directory of this process's own (in /dev/shm when there is one), for parsers that read files
// by name; removed at exit.
const std::string& scratch_dir();

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
std::string put_file(const std::string& name, std::string_view bytes);

// The input cut at lines "--- NAME" (the marker's line is dropped): sections[""] is what comes
// before the first marker, sections["NAME"] what follows "--- NAME" up to the next marker. A
// section's text keeps its own newlines but the one that ends it.
std::map<std::string, std::string> sections(std::string_view data);

// Joins sections the way sections() cuts them (the seed writers' side).
std::string join_sections(const std::map<std::string, std::string>& parts);

// Runs f; a UserError is a parser's answer to bad bytes, swallowed. Anything else propagates.
template <class F>
void expect_user_errors(F&& f) {
  try {
    f();
  } catch (const UserError&) {
  }
}

// The seed directory when ZERO3D_FUZZ_SEEDS asks for seeds, else "".
std::string seed_request();
// Writes one seed file into `dir`.
void write_seed(const std::string& dir, const std::string& name, std::string_view bytes);

}  // namespace zero3d::fuzz
