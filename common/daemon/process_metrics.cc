#include "common/daemon/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/process_stats.h"

namespace pserver {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

// Resident pages (the second field of /proc/self/statm) in bytes; -1 when
// it cannot be read.
double ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (got != 2) return -1;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Field 22 of /proc/self/stat (start time in clock ticks after boot) and
// the boot time from /proc/stat, as Unix seconds; -1 when unreadable.
double StartTimeSeconds() {
  char buf[1024];
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (f == nullptr) return -1;
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) may hold spaces: fields count from its ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return -1;
  unsigned long long start = 0;
  int field = 2;
  for (const char* q = p + 1; *q != '\0'; ++q) {
    if (*q == ' ') {
      ++field;
      if (field == 22) {
        if (std::sscanf(q + 1, "%llu", &start) != 1) return -1;
        break;
      }
    }
  }
  if (field != 22) return -1;
  std::FILE* s = std::fopen("/proc/stat", "r");
  if (s == nullptr) return -1;
  char line[256];
  double boot = -1;
  while (std::fgets(line, sizeof(line), s) != nullptr) {
    unsigned long long b = 0;
    if (std::sscanf(line, "btime %llu", &b) == 1) {
      boot = static_cast<double>(b);
      break;
    }
  }
  std::fclose(s);
  if (boot < 0) return -1;
  return boot + static_cast<double>(start) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  double n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const ProcessUsage u = ReadProcessUsage();
  out.push_back(Family("process_cpu_seconds_total",
                       "User and system CPU time spent in seconds.",
                       MetricType::Counter, u.cpu_seconds));
  out.push_back(Family("pserver_process_minor_page_faults_total",
                       "Minor page faults of the process (memory handed back "
                       "to the kernel and touched again shows here).",
                       MetricType::Counter,
                       static_cast<double>(u.minor_faults)));
  out.push_back(Family("pserver_process_peak_resident_memory_bytes",
                       "The most resident memory the process has had, in bytes.",
                       MetricType::Gauge,
                       static_cast<double>(u.peak_resident_bytes)));
  if (const double rss = ResidentBytes(); rss >= 0) {
    out.push_back(Family("process_resident_memory_bytes",
                         "Resident memory size in bytes.", MetricType::Gauge, rss));
  }
  if (const double start = StartTimeSeconds(); start >= 0) {
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since unix epoch in seconds.",
                         MetricType::Gauge, start));
  }
  if (const double fds = OpenFds(); fds >= 0) {
    out.push_back(Family("process_open_fds", "Number of open file descriptors.",
                         MetricType::Gauge, fds));
  }
  return out;
}

std::shared_ptr<ProcessMetrics> TheProcessMetrics() {
  static const auto* const kCollector =
      new std::shared_ptr<ProcessMetrics>(std::make_shared<ProcessMetrics>());
  return *kCollector;
}

}  // namespace pserver
