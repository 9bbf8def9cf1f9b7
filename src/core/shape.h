// A tensor shape (or its strides): up to kMaxRank dimensions stored inline.
//
// Inline rather than a std::vector because every view, reshape and step tensor carries two of
// them: with a heap vector each would be an allocation, and a decode step must not allocate
// (backend/workspace.h). It offers the part of the vector interface shapes are used with.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/check.h"

namespace r3 {

class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;
  using value_type = int64_t;

  Shape() = default;
  // `rank` dimensions, all zero.
  explicit Shape(std::size_t rank) { resize(rank); }
  Shape(std::initializer_list<int64_t> dims) {
    resize(dims.size());
    std::copy(dims.begin(), dims.end(), dims_.begin());
  }
  template <typename It>
  Shape(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }

  std::size_t size() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  int64_t& operator[](std::size_t i) { return dims_[i]; }
  int64_t operator[](std::size_t i) const { return dims_[i]; }
  int64_t* begin() { return dims_.data(); }
  int64_t* end() { return dims_.data() + rank_; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  const int64_t* data() const { return dims_.data(); }
  int64_t front() const { return dims_[0]; }
  int64_t back() const { return dims_[rank_ - 1]; }

  void push_back(int64_t d) {
    R3_CHECK(rank_ < kMaxRank, "a shape has at most ", kMaxRank, " dimensions");
    dims_[rank_++] = d;
  }
  void resize(std::size_t rank) {
    R3_CHECK(rank <= kMaxRank, "a shape has at most ", kMaxRank, " dimensions, not ", rank);
    for (std::size_t i = rank_; i < rank; ++i) dims_[i] = 0;
    rank_ = rank;
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  std::size_t rank_ = 0;
};

}  // namespace r3
