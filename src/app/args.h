// app/args.h: what every subcommand's parser shares. A subcommand takes the arguments after its
// name; bad input is a UserError naming the option and what would be valid (main turns it into one
// line and exit code 2 on every rank).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zero3d {

using Args = std::vector<std::string>;

// The most ranks --ranks takes (plan, train --dry-run): 2^24, beyond any machine built.
constexpr int64_t kMaxRanks = int64_t{1} << 24;

// The value of option a[i] (advances i). A UserError with `usage` when it is missing: the next
// argument is another option (`--set --deepspeed x.json` must not set a key named "--deepspeed").
std::string option_value(const Args& a, size_t& i, const char* usage);
// The comma-separated items of s ("a,b,,c": a, b, "", c).
std::vector<std::string> split_commas(const std::string& s);
// Whether --help or -h is among a.
bool wants_help(const Args& a);
// A command with subcommands (data, ckpt, bench): with no arguments its usage and exit code 2, with
// --help its usage and 0; else nullopt (go on).
std::optional<int> usage_exit(const Args& a, const char* usage);
// s as a number (finite), or as a number above 0; a UserError naming `what` otherwise.
double parse_number(const std::string& s, const char* what);
double parse_positive(const std::string& s, const char* what);
// s as a whole number from lo to hi (decimal digits, optional sign; no wrapping, no exponent); a
// UserError naming `what` and the range otherwise. Every count on a command line goes through it.
int64_t parse_whole(const std::string& s, const char* what, int64_t lo, int64_t hi);
// s as a byte count: a number with an optional K, M, G, T (or KiB...TiB, powers of 1024), from 1 to
// 2^60; a UserError naming `what` otherwise.
uint64_t parse_bytes(const std::string& s, const char* what);

}  // namespace zero3d
