// How many threads the math libraries use. One place sets ATen's intra-op pool (which,
// with Debian's OpenMP build, is also the pool OpenBLAS runs on) so that nothing
// oversubscribes the cores.
#pragma once

namespace kvevict {

// Physical cores this process may run on (SMT siblings counted once); at least 1.
int physical_core_count();

// Sets the intra-op thread count (<= 0: physical_core_count()) for ATen, OpenMP and
// OpenBLAS, and one inter-op thread (nothing here runs ops concurrently). Returns it.
int set_thread_count(int threads);

// A tiny model runs every op on one thread (use_threads_for in model.h), a process-wide setting. The
// first keeps the count it replaces; the second gives it back (a bigger model loaded next
// without --threads, as in a sweep over several models). A set_thread_count() call in
// between is a choice of its own and wins: nothing is given back after it.
void use_one_thread_for_tiny_model();
void restore_threads_after_tiny_model();

// In its scope, a library product (OpenBLAS, oneDNN) called on this thread runs on this
// thread alone. Outside a parallel region OpenBLAS splits a product over the OpenMP
// thread count, and with its Haswell/Zen kernels (AVX2 without AVX-512) an output's bits
// depend on where the split falls, so the harness splits its products itself,
// by shape only, and runs each piece in one of these. Inside a parallel region it changes
// nothing: the libraries already run there on one thread.
class BlasOnThisThread {
 public:
  BlasOnThisThread();
  ~BlasOnThisThread();
  BlasOnThisThread(const BlasOnThisThread&) = delete;
  BlasOnThisThread& operator=(const BlasOnThisThread&) = delete;

 private:
  int threads_before_;
};

}  // namespace kvevict
