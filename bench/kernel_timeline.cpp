// Every kernel's start and end on the GPU, as it ran, inside CUDA graphs too: a library the CUDA
// driver loads into any program (CUDA_INJECTION64_PATH=libr3_kernel_timeline.so) that asks CUPTI
// for its kernel activity records and, at exit, writes them to R3_TIMELINE_OUT as CSV, one row a
// kernel. Why: a decode step at batch 1 is a chain of short kernels that overlap through
// programmatic dependent launch, so each link's cost is its time on the step's critical path, which
// neither a serialised profile (Nsight Compute) nor a kernel timed alone shows.
// bench/kernel_timeline.py reads the rows; bench/gpu.sh runs both with R3_TIMELINE=1.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct Row {
  unsigned long long start, end;
  unsigned graph, stream;
  unsigned long long node;
  int grid, block, shared;
  unsigned carveout;  // the shared memory the SM was configured with while it ran
  std::string name;
};

std::mutex rows_mutex;
// Never destroyed: write_rows runs at exit, after statics made later than its registration are gone.
std::vector<Row>& rows() {
  static auto* all = new std::vector<Row>();
  return *all;
}

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "kernel timeline: %s: %s\n", what, text != nullptr ? text : "unknown CUPTI error");
}

// A kernel's name as written (CUPTI gives the mangled one).
std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard lock(rows_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    rows().push_back({k->start, k->end, k->graphId, k->streamId, k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                      k->blockX * k->blockY * k->blockZ, k->dynamicSharedMemory + k->staticSharedMemory,
                      k->sharedMemoryExecuted, demangled(k->name)});
  }
  std::free(buffer);
}

// The name quoted, so that its template arguments' commas stay in one CSV field.
std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? '\'' : c;
  return out + "\"";
}

void write_rows() {
  check(cuptiActivityFlushAll(1), "flush");
  const char* path = std::getenv("R3_TIMELINE_OUT");
  std::FILE* f = std::fopen(path != nullptr ? path : "kernel_timeline.csv", "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kernel timeline: cannot write %s\n", path != nullptr ? path : "kernel_timeline.csv");
    return;
  }
  std::lock_guard lock(rows_mutex);
  std::fprintf(f, "start_ns,end_ns,graph,node,stream,grid,block,shared_bytes,carveout_bytes,name\n");
  for (const Row& r : rows()) {
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%d,%d,%d,%u,%s\n", r.start, r.end, r.graph, r.node, r.stream, r.grid, r.block,
                 r.shared, r.carveout, csv_field(r.name).c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kernel timeline: %zu kernels\n", rows().size());
}

}  // namespace

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
  std::atexit(write_rows);
  return 1;
}
