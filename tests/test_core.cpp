// Core pieces: dtype conversions, tensors, the thread pool, the check macro.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "backend/device_memory.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/progress.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace r3 {
namespace {

TEST(DType, HalfAndBfloatKnownValues) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7C00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie rounds to even
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie rounds to even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, EveryHalfRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = f16_to_f32(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << bits;
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(h)), h) << std::hex << bits;
  }
}

// e4m3fn from its bit formula, computed here independently of the library: sign s, exponent e
// (bias 7), mantissa m; e = 0 is subnormal (m/8 * 2^-6); e = 15, m = 7 is NaN; no infinities.
double e4m3_by_formula(unsigned bits) {
  const unsigned s = bits >> 7, e = (bits >> 3) & 15u, m = bits & 7u;
  double magnitude = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, static_cast<int>(e) - 7);
  if (e == 15 && m == 7) magnitude = std::numeric_limits<double>::quiet_NaN();
  return s ? -magnitude : magnitude;
}

TEST(DType, Float8E4M3DecodesEveryByteByTheBitFormula) {
  const float* table = f8_e4m3_table();
  for (unsigned bits = 0; bits < 256; ++bits) {
    const double expected = e4m3_by_formula(bits);
    const float got = f8_e4m3_to_f32(static_cast<uint8_t>(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
      EXPECT_TRUE(std::isnan(table[bits])) << bits;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), expected) << bits;
    EXPECT_EQ(table[bits], got) << bits;
    EXPECT_EQ(std::signbit(got), (bits & 0x80) != 0) << bits;
  }
  EXPECT_EQ(f8_e4m3_to_f32(0x7E), 448.0f);   // the largest finite value
  EXPECT_EQ(f8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x01), 0x1p-9f);  // the smallest subnormal
  EXPECT_EQ(f8_e4m3_to_f32(0x07), 7 * 0x1p-9f);  // the largest subnormal
  EXPECT_EQ(f8_e4m3_to_f32(0x08), 0x1p-6f);  // the smallest normal
  EXPECT_EQ(f8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x78), 256.0f);   // S.1111.000 is a number, not infinity
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0xFF)));
  EXPECT_TRUE(std::signbit(f8_e4m3_to_f32(0x80)));  // negative zero
  float decoded[3];
  const uint8_t bytes[] = {0x38, 0xB8, 0x01};
  convert_to_f32(bytes, DType::F8_E4M3, 3, decoded);
  EXPECT_EQ(decoded[0], 1.0f);
  EXPECT_EQ(decoded[1], -1.0f);
  EXPECT_EQ(decoded[2], 0x1p-9f);
}

TEST(DType, Float8E4M3EncodesToNearestEven) {
  for (unsigned bits = 0; bits < 256; ++bits) {  // every value round-trips
    const float v = f8_e4m3_to_f32(static_cast<uint8_t>(bits));
    if (!std::isnan(v)) {
      EXPECT_EQ(f32_to_f8_e4m3(v), bits) << bits;
    }
  }
  EXPECT_EQ(f32_to_f8_e4m3(1.0625f), 0x38);    // tie between 1 and 1.125: to even (1)
  EXPECT_EQ(f32_to_f8_e4m3(1.1875f), 0x3A);    // tie between 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(f32_to_f8_e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_f8_e4m3(0x1p-10f), 0x00);   // half the smallest subnormal: ties to zero
  EXPECT_EQ(f32_to_f8_e4m3(3 * 0x1p-10f), 0x02);  // 1.5 subnormal steps: to even (2)
  EXPECT_EQ(f32_to_f8_e4m3(15 * 0x1p-10f), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(f32_to_f8_e4m3(464.0f), 0x7E);     // the tie above 448 rounds to 448
  EXPECT_EQ(f32_to_f8_e4m3(465.0f), 0x7F);     // beyond: NaN (no saturation, as torch)
  EXPECT_EQ(f32_to_f8_e4m3(-1e9f), 0xFF);
  EXPECT_EQ(f32_to_f8_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_f8_e4m3(-0.0f), 0x80);
}

TEST(DType, NamesAndConversion) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::F8_E4M3);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
  EXPECT_THROW(dtype_from_name("F8_E5M2"), Error);
  const int64_t src[] = {-3, 7};
  float dst[2];
  convert_to_f32(src, DType::I64, 2, dst);
  EXPECT_EQ(dst[0], -3.0f);
  EXPECT_EQ(dst[1], 7.0f);
}

TEST(Tensor, ShapesViewsAndChecks) {
  Tensor t = Tensor::from<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_TRUE(t.is_contiguous());
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), Shape({2, 2}));
  EXPECT_EQ(r.data<float>()[0], 3.0f);
  EXPECT_EQ(t.reshaped({2, 3}).shape(), Shape({2, 3}));
  EXPECT_THROW(t.reshaped({4, 2}), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(t.rows(2, 5), Error);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Check, MessageAndLocation) {
  try {
    R3_CHECK(1 + 1 == 3, "value was ", 42);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "value was 42");
    EXPECT_NE(e.location().find("test_core.cpp:"), std::string::npos);
  }
}

TEST(ThreadPool, CoversEveryIndexOnceAndPropagatesErrors) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  for (int64_t n : {0, 1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  // A failing job leaves chunks unclaimed; a worker that wakes late must not run them after
  // parallel_for has returned (the job it would call is gone by then). Many rounds make the late
  // wake-up likely.
  for (int round = 0; round < 300; ++round) {
    EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t) {
      if (b < 50) throw Error("boom");
    }), Error);
  }
  // Still usable after an error.
  std::atomic<int64_t> sum = 0;
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

// Captures what spdlog prints while alive.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(Progress, SilentForQuickWorkThenReportsPercentages) {
  {
    LogCapture log;
    {
      Progress quick("loading quick", 100);  // default: quiet for the first 500 ms
      quick.advance(50);
      quick.advance(50);
    }
    EXPECT_EQ(log.text(), "");
  }
  LogCapture log;
  {
    Progress slow("loading slow", 4'000'000, "MB", 1e6, std::chrono::milliseconds(0),
                  std::chrono::milliseconds(0), /*terminal=*/nullptr);
    slow.advance(1'000'000);
    slow.advance(3'000'000);
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("loading slow: 25% (1.0/4.0 MB"), std::string::npos) << text;
  EXPECT_NE(text.find("loading slow: 100% (4.0/4.0 MB"), std::string::npos) << text;
  EXPECT_NE(text.find(" done"), std::string::npos) << text;
}

int core_count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// Not on a terminal (a log file, a pipe) progress is a handful of lines: one per quarter at most,
// and the final one, where one line per print interval would flood a log on a long load.
TEST(Progress, NotATerminalPrintsAtMostOneLinePerQuarter) {
  LogCapture log;
  {
    Progress p("loading many", 1000, "MB", 1.0, std::chrono::milliseconds(0), std::chrono::milliseconds(0),
               /*terminal=*/nullptr);
    for (int i = 0; i < 1000; ++i) p.advance(1);
  }
  const std::string text = log.text();
  EXPECT_LE(core_count_lines(text), 4) << text;
  EXPECT_GE(core_count_lines(text), 2) << text;
  EXPECT_NE(text.find("loading many: 25% (250/1000 MB"), std::string::npos) << text;
  EXPECT_NE(text.find("loading many: 100% (1000/1000 MB"), std::string::npos) << text;
  EXPECT_EQ(text.find("loading many: 100%"), text.rfind("loading many: 100%")) << "one final line: " << text;
}

// A count (unit scale 1) is shown whole, and the caller's detail text follows the time.
TEST(Progress, CountsAreWholeAndDetailFollowsTheTime) {
  LogCapture log;
  {
    Progress p("bench", 12, "requests", 1.0, std::chrono::milliseconds(0), std::chrono::milliseconds(0),
               /*terminal=*/nullptr);
    p.set_detail("850 output tokens/s");
    p.advance(6);
    p.advance(6);
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("bench: 50% (6/12 requests, "), std::string::npos) << text;
  EXPECT_NE(text.find(" s, 850 output tokens/s)"), std::string::npos) << text;
  EXPECT_NE(text.find("bench: 100% (12/12 requests, "), std::string::npos) << text;
}

// On a terminal: one line redrawn in place (carriage returns), one newline at the very end,
// nothing in the log; and nothing at all when the log level hides info (-q).
TEST(Progress, OnATerminalOneLineIsRedrawnInPlace) {
  auto drawn = [](spdlog::level::level_enum level) {
    std::FILE* terminal = std::tmpfile();
    EXPECT_NE(terminal, nullptr);
    LogCapture log;
    spdlog::set_level(level);
    {
      Progress p("loading many", 1000, "MB", 1.0, std::chrono::milliseconds(0), std::chrono::milliseconds(0),
                 terminal);
      for (int i = 0; i < 1000; ++i) p.advance(1);
    }
    spdlog::set_level(spdlog::level::info);
    EXPECT_EQ(log.text(), "");
    std::rewind(terminal);
    std::string text;
    for (int c; (c = std::fgetc(terminal)) != EOF;) text += static_cast<char>(c);
    std::fclose(terminal);
    return text;
  };
  const std::string text = drawn(spdlog::level::info);
  EXPECT_EQ(core_count_lines(text), 1);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_GT(std::count(text.begin(), text.end(), '\r'), 100);  // redrawn on every advance here
  const std::string last = text.substr(text.rfind('\r'));
  EXPECT_NE(last.find("loading many: 100% (1000/1000 MB"), std::string::npos) << last;
  EXPECT_NE(last.find(" done"), std::string::npos) << last;
  EXPECT_EQ(drawn(spdlog::level::warn), "");
}

// Weights converted for the GPU's bf16 mode: every value rounded as f32_to_bf16 rounds it, across
// the conversion's internal blocks (200,003 values: several blocks and a partial last one), and
// widening to F32 exact.
TEST(ConvertMatrix, Bf16RoundsEveryValueAndF32WidensExactly) {
  const int64_t n = 200003;
  Tensor f32 = Tensor::empty(DType::F32, {n});
  for (int64_t i = 0; i < n; ++i) f32.data<float>()[i] = std::sin(static_cast<float>(i) * 0.37f) * 1e3f;
  Tensor bf16 = Tensor::empty(DType::BF16, {n});
  backend::convert_matrix(f32, DType::BF16, bf16.raw_data());
  const auto* bits = static_cast<const uint16_t*>(bf16.raw_data());
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += bits[i] != f32_to_bf16(f32.data<float>()[i]);
  EXPECT_EQ(wrong, 0);
  Tensor wide = Tensor::empty(DType::F32, {n});
  backend::convert_matrix(bf16, DType::F32, wide.raw_data());
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(wide.data<float>()[i], bf16_to_f32(bits[i])) << i;
}

}  // namespace
}  // namespace r3
