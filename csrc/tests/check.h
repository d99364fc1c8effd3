// What the sanitizer tests share: EXPECT counts a check and reports a failed
// one (the run then exits non-zero), and the clock they time with.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

namespace hocc_test {

using Clock = std::chrono::steady_clock;

inline std::atomic<long> g_checks{0};
inline std::atomic<long> g_failures{0};
inline std::mutex g_out;

inline void report_failure(const char* file, int line, const std::string& what) {
  std::lock_guard<std::mutex> lk(g_out);
  std::fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  ++g_failures;
}

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// the call queue's checks (call_queue_test.cc)
void call_queue_checks();

}  // namespace hocc_test

#define EXPECT(cond, what)                                                          \
  do {                                                                              \
    ++hocc_test::g_checks;                                                          \
    if (!(cond)) hocc_test::report_failure(__FILE__, __LINE__, std::string(what)); \
  } while (0)
