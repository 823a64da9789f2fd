#include "bench_output.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "errors.h"
#include "format.h"

namespace fa3::cli {
namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

// RFC 4180: quote a field holding a comma, a quote or a line break; double the quotes.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

// Shortest text that reads back to the same double: the files are data, not a report.
std::string exact_number(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("0");
}

}  // namespace

std::string to_json(const std::vector<BenchRecord>& records) {
  std::ostringstream s;
  s << "[";
  bool first = true;
  for (const BenchRecord& r : records) {
    if (!r.error.empty()) continue;
    s << (first ? "\n" : ",\n") << "  {\"impl\": \"fa3\", \"pass\": " << json_string(r.pass)
      << ", \"dtype\": " << json_string(r.dtype) << ", \"hdim\": " << r.hdim;
    if (r.hdim_v > 0) s << ", \"hdim_v\": " << r.hdim_v;
    s << ", \"causal\": " << (r.causal ? "true" : "false") << ", \"seqlen\": " << r.seqlen << ", \"batch\": " << r.batch
      << ", \"nheads\": " << r.nheads << ", \"tflops\": " << exact_number(r.tflops)
      << ", \"ms\": " << exact_number(r.ms) << ", \"device\": " << json_string(r.device)
      << ", \"gpu\": " << json_string(r.gpu);
    if (!r.timing.empty()) s << ", \"timing\": " << json_string(r.timing);
    if (r.pass == "bwd") s << ", \"deterministic\": " << (r.deterministic ? "true" : "false");
    s << "}";
    first = false;
  }
  s << (first ? "]\n" : "\n]\n");
  return s.str();
}

std::string to_csv(const std::vector<BenchRecord>& records, const CsvColumns& columns) {
  std::ostringstream s;
  s << "impl,pass,dtype,hdim" << (columns.hdim_v ? ",hdim_v" : "") << ",causal,seqlen,batch,nheads,tflops,ms,device,gpu"
    << (columns.timing ? ",timing" : "") << (columns.deterministic ? ",deterministic" : "") << '\n';
  for (const BenchRecord& r : records) {
    if (!r.error.empty()) continue;
    s << "fa3," << csv_field(r.pass) << ',' << csv_field(r.dtype) << ',' << r.hdim;
    if (columns.hdim_v) s << ',' << r.hdim_v;
    s << ',' << (r.causal ? "true" : "false") << ',' << r.seqlen << ',' << r.batch << ',' << r.nheads << ','
      << exact_number(r.tflops) << ',' << exact_number(r.ms) << ',' << csv_field(r.device) << ',' << csv_field(r.gpu);
    if (columns.timing) s << ',' << csv_field(r.timing);
    if (columns.deterministic) s << ',' << (r.deterministic ? "true" : "false");
    s << '\n';
  }
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw RunError("cannot open '" + path + "' for writing");
  f << text;
  f.close();
  if (!f) throw RunError("writing '" + path + "' failed");
}

std::string table(const std::vector<BenchRecord>& records) {
  const bool hdim_v = std::any_of(records.begin(), records.end(), [](const BenchRecord& r) { return r.hdim_v > 0; });
  std::ostringstream s;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%5s", "hdim");
  s << buf;
  if (hdim_v) {
    std::snprintf(buf, sizeof buf, " %6s", "hdim_v");
    s << buf;
  }
  std::snprintf(buf, sizeof buf, " %7s %7s %6s %7s %12s %10s\n", "causal", "seqlen", "batch", "nheads", "ms",
                "TFLOP/s");
  s << buf;
  for (const BenchRecord& r : records) {
    const std::string ms = r.error.empty() ? fixed(r.ms, 4) : "rejected";
    const std::string tflops = r.error.empty() ? significant(r.tflops, 3) : "-";
    std::snprintf(buf, sizeof buf, "%5lld", static_cast<long long>(r.hdim));
    s << buf;
    if (hdim_v) {
      std::snprintf(buf, sizeof buf, " %6lld", static_cast<long long>(r.hdim_v));
      s << buf;
    }
    std::snprintf(buf, sizeof buf, " %7s %7lld %6lld %7lld %12s %10s\n", r.causal ? "yes" : "no",
                  static_cast<long long>(r.seqlen), static_cast<long long>(r.batch), static_cast<long long>(r.nheads),
                  ms.c_str(), tflops.c_str());
    s << buf;
  }
  return s.str();
}

Progress::Progress(std::size_t total) : total_(total), enabled_(isatty(STDOUT_FILENO) == 1) {}

Progress::~Progress() {
  if (enabled_) {
    std::fputs("\r\033[K", stdout);  // leave a clean line for the table
    std::fflush(stdout);
  }
}

void Progress::show(std::size_t index, const std::string& what) {
  if (!enabled_) return;
  std::printf("\r\033[K[%zu/%zu] %s ...", index + 1, total_, what.c_str());
  std::fflush(stdout);
}

}  // namespace fa3::cli
