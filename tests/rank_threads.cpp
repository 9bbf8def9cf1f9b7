#include "rank_threads.h"

#include <exception>
#include <thread>

namespace r3::test {

std::vector<std::string> run_rank_threads(moe::ep::InProcessGroup& group, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(group.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        group.rank(r).abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace r3::test
