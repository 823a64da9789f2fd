// fa3 program — the results of `fa3 bench`: records, the final table, JSON and CSV
// files, and the progress line shown on a terminal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa3::cli {

// One timed shape. The field names are those of the JSON and CSV output.
struct BenchRecord {
  std::string pass = "fwd";    // "fwd" or "bwd"
  bool deterministic = false;  // bwd only: BackwardArgs::deterministic
  std::string dtype;
  std::int64_t hdim = 0;
  std::int64_t hdim_v = 0;  // --head-dim-v's; 0: not asked for, and the files leave the field out
  bool causal = false;
  std::int64_t seqlen = 0;
  std::int64_t batch = 0;
  std::int64_t nheads = 0;
  double tflops = 0;
  double ms = 0;
  std::string device;  // "gpu" or "cpu"
  std::string gpu;     // the GPU's name, or "cpu"
  std::string timing;  // "l2-flushed": GPU calls timed after an L2 flush (--flush-l2); empty: back to back
  std::string error;   // why the library rejected the shape; such records are not written
};

// Records without an error, as {"impl": "fa3", "pass": "fwd", ...} objects; "hdim_v"
// follows "hdim" when the record has one, "timing" follows "gpu" when the record has
// one, and "bwd" records end with "deterministic".
std::string to_json(const std::vector<BenchRecord>& records);

// The CSV columns beyond the fixed ones. A file holds one sweep, so every record has
// them or none does.
struct CsvColumns {
  bool hdim_v = false;         // after hdim: the sweep asked for a V head dim
  bool deterministic = false;  // last: a backward sweep
  bool timing = false;         // after gpu: GPU calls timed after an L2 flush
};
// The same as CSV, one record a line.
std::string to_csv(const std::vector<BenchRecord>& records, const CsvColumns& columns);
// Throws RunError when the file cannot be written.
void write_file(const std::string& path, const std::string& text);

// Every record, failures included, aligned in columns; an hdim_v column when any record
// has one.
std::string table(const std::vector<BenchRecord>& records);

// "[3/36] hdim 128 causal seqlen 2048 ..." rewritten in place, when stdout is a
// terminal; nothing otherwise, so that piped output stays clean.
class Progress {
 public:
  explicit Progress(std::size_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void show(std::size_t index, const std::string& what);

 private:
  std::size_t total_;
  bool enabled_;
};

}  // namespace fa3::cli
