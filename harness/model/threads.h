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

}  // namespace kvevict
