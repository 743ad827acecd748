#include "harness/model/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <omp.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace kvevict {
namespace {

int threads_before_tiny_model = 0;  // 0: none set aside

void apply_thread_count(int threads) {
  // The inter-op pool can be sized only before its first use, so only once.
  static const bool interop_set = [] {
    try {
      at::set_num_interop_threads(1);
    } catch (const std::exception&) {
    }
    return true;
  }();
  (void)interop_set;
  at::set_num_threads(threads);  // also omp_set_num_threads in the OpenMP build
  // An OpenBLAS built with pthreads keeps its own pool; tell it too when present.
  using SetThreads = void (*)(int);
  if (auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas(threads);
}

int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int value = fallback;
  if (!(in >> value)) return fallback;
  return value;
}

}  // namespace

int physical_core_count() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
  }
  std::set<std::pair<int, int>> cores;  // (package, core)
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    // Without topology files every allowed CPU counts as a core of its own.
    cores.insert({read_int(dir + "physical_package_id", 0), read_int(dir + "core_id", cpu)});
  }
  return cores.empty() ? 1 : static_cast<int>(cores.size());
}

int set_thread_count(int threads) {
  if (threads <= 0) threads = physical_core_count();
  threads_before_tiny_model = 0;
  apply_thread_count(threads);
  return threads;
}

void use_one_thread_for_tiny_model() {
  if (threads_before_tiny_model == 0) threads_before_tiny_model = at::get_num_threads();
  apply_thread_count(1);
}

void restore_threads_after_tiny_model() {
  if (threads_before_tiny_model > 0) apply_thread_count(threads_before_tiny_model);
  threads_before_tiny_model = 0;
}

// OpenMP's thread count is per calling thread, and Debian's OpenBLAS (the OpenMP build)
// reads it at every call.
BlasOnThisThread::BlasOnThisThread() : threads_before_(omp_get_max_threads()) { omp_set_num_threads(1); }
BlasOnThisThread::~BlasOnThisThread() { omp_set_num_threads(threads_before_); }

}  // namespace kvevict
