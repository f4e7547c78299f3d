// Slurm hostlists: "node[01-04,07]", "linux[1,2]", "a,b,c", "nodeA,nodeB[001,003]", "rack[1-2]-n[01-02]",
// "gpu-a100-[1-3]", and SLURM_TASKS_PER_NODE's "2(x3),1".
//
// Pure functions with Slurm's semantics (each case of tests/launcher/hostlist_test.cc was checked against
// `scontrol show hostnames` of Slurm 22.05): a range keeps the zero padding of its lower bound ("[09-11]" ->
// 09,10,11; "[9-11]" -> 9,10,11; "[008-12]" -> 008..012); several bracket groups in one name expand as a
// cartesian product in Slurm's order (left to right for two groups; hostlist.cc has the rule for three or
// more); commas and blanks split hosts outside brackets, commas split ranges inside; empty items ("a,,b")
// are skipped; order and duplicates are kept.
// Differences from Slurm 22.05, on input Slurm itself never produces: text after the last ']' ("c[5-6]-ib",
// "[1-2]x") is expanded as a suffix (Slurm refuses it); unbalanced brackets ("node[1-2", "node1-2]"), half
// ranges ("[1-]") and blanks inside brackets are refused (Slurm guesses). Thread-safe. Errors: nullopt, with
// `error` saying what is wrong and where.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

std::optional<std::vector<std::string>> expand_hostlist(std::string_view list, std::string& error);

// "2(x3),1" -> {2, 2, 2, 1}.
std::optional<std::vector<int>> expand_tasks_per_node(std::string_view spec, std::string& error);

}  // namespace ddprun::launcher
