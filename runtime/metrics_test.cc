#include "runtime/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port and returns the whole response.
std::string Http(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  close(fd);
  return response;
}

TEST(MetricsTest, ServesInstrumentsAndCollectorsAtMetrics) {
  MetricsOptions options;
  options.address = "127.0.0.1:0";
  auto metrics = Metrics::Start(options);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  Metrics& m = **metrics;
  ASSERT_GT(m.port(), 0);
  prometheus::BuildCounter()
      .Name("test_events_total")
      .Help("events")
      .Register(m.registry())
      .Add({{"kind", "a"}})
      .Increment(3);
  int calls = 0;
  m.AddCollector([&calls] {
    ++calls;
    std::vector<prometheus::MetricFamily> f;
    f.push_back(
        FamilyBuilder("test_state", "state read when scraped", prometheus::MetricType::Gauge)
            .Add(42, {{"shard", "x"}})
            .Build());
    return f;
  });
  const std::string r = Http(m.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(r, HasSubstr("test_events_total{kind=\"a\"} 3"));
  EXPECT_THAT(r, HasSubstr("# TYPE test_state gauge\ntest_state{shard=\"x\"} 42"));
  EXPECT_EQ(calls, 1);
  // The collectors are gone once removed (the daemon they read is going away).
  m.RemoveCollectors();
  EXPECT_THAT(Http(m.port(), "GET /metrics HTTP/1.1\r\n\r\n"), Not(HasSubstr("test_state")));
}

TEST(MetricsTest, AnythingButGetMetricsIsRefusedAndTheEndpointGoesOn) {
  MetricsOptions options;
  options.address = "127.0.0.1:0";
  auto metrics = Metrics::Start(options);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const int port = (*metrics)->port();
  EXPECT_THAT(Http(port, "GET /admin HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(Http(port, "POST /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(Http(port, "\r\n\r\n"), StartsWith("HTTP/1.1 400 Bad Request"));
  // A request of 8 KiB with no end of headers is refused; the next scrape is served.
  EXPECT_THAT(Http(port, std::string(8192, 'x')), StartsWith("HTTP/1.1 400 Bad Request"));
  EXPECT_THAT(Http(port, "GET /metrics?x=1 HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200 OK"));
}

TEST(MetricsTest, ABadAddressOrABusyPortIsAClearError) {
  MetricsOptions options;
  options.address = "nohost";
  EXPECT_THAT(Metrics::Start(options).status().message(), HasSubstr("is not host:port"));
  options.address = "localhost:0";
  EXPECT_THAT(Metrics::Start(options).status().message(), HasSubstr("is not a numeric host:port"));
  options.address = "127.0.0.1:0";
  auto first = Metrics::Start(options);
  ASSERT_TRUE(first.ok());
  options.address = absl::StrCat("127.0.0.1:", (*first)->port());
  EXPECT_THAT(Metrics::Start(options).status().message(),
              HasSubstr("cannot serve metrics on " + options.address));
}

}  // namespace
}  // namespace pscluster
