// The per-expert load files `r3 eplb-plan` reads: one list of per-expert loads, a list of such
// lists (one per MoE layer), or an object with the same under "load". Read through the one file
// reader (size-limited, depth-limited JSON); every value checked.
#pragma once

#include <string>
#include <vector>

namespace r3 {

// [layers][experts] non-negative loads, the same expert count in every layer. Throws r3::Error
// naming the file, layer and value.
std::vector<std::vector<double>> read_expert_loads(const std::string& path);

}  // namespace r3
