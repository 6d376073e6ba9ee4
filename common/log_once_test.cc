#include "common/log_once.h"

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

// Counts the lines logged by each call site (PS_LOG_FIRST_N's message is the site's number).
class CountingSink : public google::LogSink {
 public:
  void send(google::LogSeverity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t length) override {
    absl::MutexLock lock(&mu_);
    const std::string text(message, length);
    if (text.rfind("site ", 0) == 0) ++lines_[std::stoi(text.substr(5))];
  }
  std::vector<int> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int> lines_ = std::vector<int>(64);
};

// One call site per I, so that each site is first reached by several threads at once.
template <int I, int N>
void LogAtSite() {
  PS_LOG_FIRST_N(INFO, N) << "site " << I;
}

template <int N, int... I>
void LogAtEverySite(std::integer_sequence<int, I...>) {
  (LogAtSite<I, N>(), ...);
}

template <int N>
std::vector<int> RaceEverySite() {
  CountingSink sink;
  google::AddLogSink(&sink);
  std::atomic<int> ready{0};
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (int round = 0; round < 3; ++round) {
        LogAtEverySite<N>(std::make_integer_sequence<int, 64>());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  google::RemoveLogSink(&sink);
  return sink.lines();
}

// Exactly N lines per site however many threads call it at once. (glog's LOG_FIRST_N can log
// none when two threads reach a site together; that window is too narrow to hit reliably here.)
TEST(LogOnceTest, EverySiteLogsExactlyItsFirstNCallsUnderConcurrentCalls) {
  for (int lines : RaceEverySite<1>()) EXPECT_EQ(lines, 1);
  for (int lines : RaceEverySite<3>()) EXPECT_EQ(lines, 3);
}

}  // namespace
}  // namespace pscluster
