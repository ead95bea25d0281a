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
std::string usage_main();

}  // namespace zero3d
