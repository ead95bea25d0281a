// app/commands.h: the subcommands of the zero3d executable, one file each in src/app/. Each takes
// the arguments after its name, throws UserError for bad input and returns the exit code.
#pragma once
#include "app/args.h"

namespace zero3d {

int cmd_train(const Args& args);     // app/train.cpp
int cmd_plan(const Args& args);      // app/plan.cpp
int cmd_generate(const Args& args);  // app/generate.cpp
int cmd_eval(const Args& args);      // app/eval.cpp
int cmd_data(const Args& args);      // app/data.cpp
int cmd_ckpt(const Args& args);      // app/ckpt.cpp
int cmd_bench(const Args& args);     // app/bench.cpp

}  // namespace zero3d
