// moe/exact_order_sum.h: a double sum of terms that each add exactly (0 or in [2^-21, 1], at most
// 256 of them) has the same bits in every order, and equals the exact sum, computed here in
// integers of 2^-44. The routing kernels rely on it to sum a softmax's exps as a warp tree and
// still give the CPU's index-order bits. A term below 2^-21 can make the order matter, so the
// bound is not vacuous.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "moe/exact_order_sum.h"

namespace r3::moe {
namespace {

double index_order(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x);
  return sum;
}

// Pairwise, as a warp's shuffle tree adds: each lane's terms, then halves.
double tree_order(const std::vector<float>& v) {
  std::vector<double> lane(32, 0.0);
  for (std::size_t i = 0; i < v.size(); ++i) lane[i % 32] += static_cast<double>(v[i]);
  for (std::size_t half = 16; half > 0; half /= 2) {
    for (std::size_t l = 0; l < half; ++l) lane[l] += lane[l + half];
  }
  return lane[0];
}

// The exact sum in units of 2^-44, as a double (at most 2^52 units: exactly representable).
double exact_sum(const std::vector<float>& v) {
  int64_t units = 0;
  for (float x : v) {
    const double scaled = std::ldexp(static_cast<double>(x), 44);
    EXPECT_EQ(scaled, std::floor(scaled)) << x << " is not a multiple of 2^-44";
    units += static_cast<int64_t>(scaled);
  }
  return std::ldexp(static_cast<double>(units), -44);
}

TEST(ExactOrderSum, TermsThatAddExactlySumToTheSameBitsInEveryOrder) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> spread(0.0f, 14.5f);  // exp(-14.5) > 2^-21
  std::uniform_int_distribution<int> kind(0, 9);
  for (int trial = 0; trial < 2000; ++trial) {
    const auto n = static_cast<std::size_t>(1 + trial % kExactSumMaxTerms);
    std::vector<float> v(n);
    for (float& x : v) {
      const int k = kind(rng);
      x = k == 0 ? 0.0f : k == 1 ? 1.0f : k == 2 ? kExactSumSmallest : std::exp(-spread(rng));
      ASSERT_TRUE(adds_exactly(x)) << x;
    }
    const double exact = exact_sum(v);
    ASSERT_EQ(index_order(v), exact) << "trial " << trial;
    ASSERT_EQ(tree_order(v), exact) << "trial " << trial;
    std::vector<float> reversed(v.rbegin(), v.rend());
    ASSERT_EQ(index_order(reversed), exact) << "trial " << trial;
    std::shuffle(v.begin(), v.end(), rng);
    ASSERT_EQ(index_order(v), exact) << "trial " << trial;
  }
}

TEST(ExactOrderSum, TheLargestSumFitsADouble) {
  // 256 terms, each 1 - 2^-24 or 2^-21 + 2^-44 (the finest units at each end): still exact.
  std::vector<float> v;
  for (int i = 0; i < kExactSumMaxTerms; ++i) {
    v.push_back(i % 2 == 0 ? std::nextafter(1.0f, 0.0f) : std::nextafter(kExactSumSmallest, 1.0f));
  }
  EXPECT_EQ(index_order(v), exact_sum(v));
  EXPECT_EQ(tree_order(v), exact_sum(v));
}

TEST(ExactOrderSum, AdmitsOnlyZeroAndTermsFromTheSmallestToOne) {
  EXPECT_TRUE(adds_exactly(0.0f));
  EXPECT_TRUE(adds_exactly(kExactSumSmallest));
  EXPECT_TRUE(adds_exactly(1.0f));
  EXPECT_FALSE(adds_exactly(std::nextafter(kExactSumSmallest, 0.0f)));
  EXPECT_FALSE(adds_exactly(std::nextafter(1.0f, 2.0f)));
  EXPECT_FALSE(adds_exactly(-kExactSumSmallest));
  EXPECT_FALSE(adds_exactly(std::nanf("")));
}

TEST(ExactOrderSum, ATermBelowTheSmallestCanMakeTheOrderMatter) {
  // 128 ones then two halves of the sum's last place: in index order each half rounds away (to
  // even); added first, they make a whole unit that survives.
  std::vector<float> v(128, 1.0f);
  v.push_back(0x1p-46f);
  v.push_back(0x1p-46f);
  ASSERT_FALSE(adds_exactly(0x1p-46f));
  std::vector<float> reversed(v.rbegin(), v.rend());
  EXPECT_EQ(index_order(v), 128.0);
  EXPECT_EQ(index_order(reversed), 128.0 + 0x1p-45);
}

}  // namespace
}  // namespace r3::moe
