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

}  // namespace kvevict
