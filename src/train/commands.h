// train/commands.h: the subcommands of the zero3d executable. Each takes the arguments after its
// name, throws UserError for bad input (main turns it into one line and exit code 2 on every
// rank) and returns the exit code.
#pragma once
#include <string>
#include <vector>

namespace zero3d {

using Args = std::vector<std::string>;

int cmd_train(const Args& args);
int cmd_data(const Args& args);
int cmd_bench(const Args& args);
int cmd_ckpt(const Args& args);
int cmd_generate(const Args& args);  // train/infer.cpp
int cmd_eval(const Args& args);
int cmd_plan(const Args& args);  // train/plan.cpp
std::string usage_main();

// Shared by the subcommands' parsers: the value of option a[i] (advances i; a UserError with
// `usage` when it is missing), and the comma-separated items of s ("a,b,,c": a, b, "", c).
std::string option_value(const Args& a, size_t& i, const char* usage);
std::vector<std::string> split_commas(const std::string& s);

}  // namespace zero3d
