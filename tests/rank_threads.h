// Expert-parallel ranks as threads for the tests of moe/ep (test_expert_transport.cpp,
// test_expert_weight_moves.cpp): runs body(rank) on one thread per rank of an in-process group.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moe/ep/in_process_transport.h"

namespace r3::test {

// The errors the ranks threw, by rank ("" for none). A rank that throws aborts the group with its
// error, so that a failing test ends instead of leaving the other ranks waiting for it.
std::vector<std::string> run_rank_threads(moe::ep::InProcessGroup& group, const std::function<void(int)>& body);

}  // namespace r3::test
